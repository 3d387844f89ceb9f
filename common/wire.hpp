// Little-endian byte packing for what ranks and processes exchange: the fabric's rail addresses
// and region descriptors (through the bootstrap), fixed-size records in shared memory.
// Fixed-width fields in a fixed byte order, so bytes mean the same on every rank.
//   ByteWriter  appends to a vector, or fills a caller's fixed span (no allocation) and throws
//               proxyep::Error naming `phase` instead of writing past its end.
//   ByteReader  bounds-checked: throws proxyep::Error naming `phase` instead of reading past the
//               end of a malformed blob; expect_end() rejects trailing bytes.
// Both are in namespace proxyep with the rest of the project's vocabulary (control/'s
// bootstrap frames have their own control::wire namespace).
#pragma once

#include "common/error.hpp"

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep {

class ByteWriter {
 public:
  // Appends every field to `out` (which grows).
  explicit ByteWriter(std::vector<uint8_t>& out) : out_(&out), start_(out.size()) {}
  // Writes fields into `out` from its first byte on; a field that does not fit throws
  // proxyep::Error naming `phase` and nothing of it is written. `phase` is kept as a view: pass a
  // literal or a string that outlives the writer.
  ByteWriter(std::span<uint8_t> out, std::string_view phase) : fixed_(out), phase_(phase) {}
  ByteWriter(std::span<std::byte> out, std::string_view phase)
      : ByteWriter(std::span<uint8_t>(reinterpret_cast<uint8_t*>(out.data()), out.size()), phase) {}

  void u8(uint8_t value) { put(value, 1); }
  void u16(uint16_t value) { put(value, 2); }
  void u32(uint32_t value) { put(value, 4); }
  void u64(uint64_t value) { put(value, 8); }
  // Each value as a u32 (two's complement). On little-endian hosts the array's own bytes are
  // those fields, so it is one copy instead of a loop per byte (records carry hundreds).
  void i32s(std::span<const int32_t> values) {
    if constexpr (std::endian::native == std::endian::little) {
      bytes({reinterpret_cast<const uint8_t*>(values.data()), values.size_bytes()});
    } else {
      for (int32_t v : values)
        u32(static_cast<uint32_t>(v));
    }
  }
  void bytes(std::span<const uint8_t> data) {
    if (out_ != nullptr) {
      out_->insert(out_->end(), data.begin(), data.end());
      return;
    }
    need(data.size());
    if (!data.empty()) std::memcpy(fixed_.data() + pos_, data.data(), data.size());
    pos_ += data.size();
  }

  // Bytes this writer has written (appended, or from the start of the fixed span).
  size_t written() const { return out_ != nullptr ? out_->size() - start_ : pos_; }

 private:
  void need(size_t count) const {
    require(count <= fixed_.size() - pos_, phase_,
            "record overflow: {} bytes at offset {} do not fit the {}-byte buffer", count, pos_,
            fixed_.size());
  }
  void put(uint64_t value, int width) {
    if (out_ != nullptr) {
      for (int i = 0; i < width; ++i)
        out_->push_back(static_cast<uint8_t>(value >> (8 * i)));
      return;
    }
    need(static_cast<size_t>(width));
    for (int i = 0; i < width; ++i)
      fixed_[pos_ + static_cast<size_t>(i)] = static_cast<uint8_t>(value >> (8 * i));
    pos_ += static_cast<size_t>(width);
  }

  std::vector<uint8_t>* out_ = nullptr;  // append mode
  size_t start_ = 0;                     // append mode: out_'s size at construction
  std::span<uint8_t> fixed_;             // fixed mode
  std::string_view phase_;               // fixed mode
  size_t pos_ = 0;                       // fixed mode
};

class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> data, std::string phase)
      : data_(data), phase_(std::move(phase)) {}
  ByteReader(std::span<const std::byte> data, std::string phase)
      : ByteReader(
            std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size()),
            std::move(phase)) {}

  uint8_t u8(const char* what) { return static_cast<uint8_t>(get(1, what)); }
  uint16_t u16(const char* what) { return static_cast<uint16_t>(get(2, what)); }
  uint32_t u32(const char* what) { return static_cast<uint32_t>(get(4, what)); }
  uint64_t u64(const char* what) { return get(8, what); }
  // out.size() u32 fields as int32 (ByteWriter::i32s).
  void i32s(std::span<int32_t> out, const char* what) {
    if constexpr (std::endian::native == std::endian::little) {
      const auto raw = bytes(out.size_bytes(), what);
      if (!raw.empty()) std::memcpy(out.data(), raw.data(), raw.size());
    } else {
      for (int32_t& v : out)
        v = static_cast<int32_t>(u32(what));
    }
  }
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
      value |= uint64_t{data_[pos_ + static_cast<size_t>(i)]} << (8 * i);
    pos_ += static_cast<size_t>(width);
    return value;
  }
  std::span<const uint8_t> data_;
  std::string phase_;
  size_t pos_ = 0;
};

}  // namespace proxyep
