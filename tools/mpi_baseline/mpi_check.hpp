// Error checking and datatype ownership shared by the MPI baselines (mpi_ep*.hpp, mpi_ll.hpp).
#pragma once

#include <mpi.h>

#include <cstddef>

namespace proxyep::tools {

// Throws proxyep::Error("mpi_baseline") naming `what` and MPI's error text unless rc is
// MPI_SUCCESS.
void check_mpi(int rc, const char* what);

// A committed datatype of `bytes` contiguous bytes, freed on destruction: one row or record, so
// that counts and displacements are in rows (an int of bytes would overflow at DeepEP's sizes).
class MpiBytesType {
 public:
  explicit MpiBytesType(size_t bytes);
  ~MpiBytesType();
  MpiBytesType(const MpiBytesType&) = delete;
  MpiBytesType& operator=(const MpiBytesType&) = delete;

  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

}  // namespace proxyep::tools
