#include "tools/mpi_baseline/mpi_check.hpp"

#include "common/error.hpp"

#include <string>

namespace proxyep::tools {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  fail("mpi_baseline", "{} failed: {}", what, std::string(text, static_cast<size_t>(length)));
}

MpiBytesType::MpiBytesType(size_t bytes) {
  check_mpi(MPI_Type_contiguous(static_cast<int>(bytes), MPI_BYTE, &type_), "MPI_Type_contiguous");
  check_mpi(MPI_Type_commit(&type_), "MPI_Type_commit");
}

MpiBytesType::~MpiBytesType() {
  if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
}

}  // namespace proxyep::tools
