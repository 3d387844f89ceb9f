// Little-endian byte packing for what the fabric layer exchanges through the bootstrap (rail
// addresses, region descriptors). Fixed-width fields in a fixed byte order, so blobs mean the
// same on every rank; the reader is bounds-checked and throws proxyep::Error naming `phase`
// instead of reading past the end of a malformed blob.
#pragma once

#include "common/error.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace proxyep::fabric {

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>& out) : out_(out) {}

  void u16(uint16_t value) { put(value, 2); }
  void u32(uint32_t value) { put(value, 4); }
  void u64(uint64_t value) { put(value, 8); }
  void bytes(std::span<const uint8_t> data) { out_.insert(out_.end(), data.begin(), data.end()); }

 private:
  void put(uint64_t value, int width) {
    for (int i = 0; i < width; ++i)
      out_.push_back(static_cast<uint8_t>(value >> (8 * i)));
  }
  std::vector<uint8_t>& out_;
};

class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> data, std::string phase)
      : data_(data), phase_(std::move(phase)) {}

  uint16_t u16(const char* what) { return static_cast<uint16_t>(get(2, what)); }
  uint32_t u32(const char* what) { return static_cast<uint32_t>(get(4, what)); }
  uint64_t u64(const char* what) { return get(8, what); }
  std::span<const uint8_t> bytes(size_t count, const char* what) {
    need(count, what);
    auto out = data_.subspan(pos_, count);
    pos_ += count;
    return out;
  }
  size_t remaining() const { return data_.size() - pos_; }
  // Trailing garbage means the blob is not what the writer produced: reject it too.
  void expect_end(const char* what) const {
    require(pos_ == data_.size(), phase_, "{}: {} unexpected trailing bytes", what,
            data_.size() - pos_);
  }

 private:
  void need(size_t count, const char* what) const {
    require(count <= data_.size() - pos_, phase_,
            "malformed blob: {} needs {} bytes at offset {}, only {} left", what, count, pos_,
            data_.size() - pos_);
  }
  uint64_t get(int width, const char* what) {
    need(static_cast<size_t>(width), what);
    uint64_t value = 0;
    for (int i = 0; i < width; ++i)
      value |= uint64_t{data_[pos_ + i]} << (8 * i);
    pos_ += static_cast<size_t>(width);
    return value;
  }
  std::span<const uint8_t> data_;
  std::string phase_;
  size_t pos_ = 0;
};

}  // namespace proxyep::fabric
