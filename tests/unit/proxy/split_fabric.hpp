// Test double: one rank's Fabric made of several single-rail Fabric instances, each with its own
// libfabric domain, presented as one fabric with one rail per instance. This box has one NIC, so
// a real Fabric puts every rail on one domain and the engine runs one thread; with this, rails
// report distinct domain names and the engine runs one proxy thread per rail, which is how a
// multi-NIC host (p5: 4 EFA devices per GPU) looks to it.
#pragma once

#include "fabric/fabric.hpp"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace proxyep::proxy::testing {

// A rail whose capabilities carry another domain name; everything else is forwarded.
class RenamedRail final : public fabric::Transport {
 public:
  RenamedRail(fabric::Transport& inner, int index, std::string domain)
      : inner_(inner), index_(index), caps_(inner.capabilities()) {
    caps_.domain_name = std::move(domain);
  }
  const fabric::Capabilities& capabilities() const override { return caps_; }
  int rail_index() const override { return index_; }
  fabric::Bytes address() const override { return inner_.address(); }
  void connect(const std::vector<fabric::Bytes>& addresses) override { inner_.connect(addresses); }
  [[nodiscard]] Status write(const fabric::WriteOp& op) override { return inner_.write(op); }
  [[nodiscard]] Status poll(std::span<fabric::Completion> out, size_t& count) override {
    return inner_.poll(out, count);
  }
  size_t writes_in_flight() const override { return inner_.writes_in_flight(); }
  const std::string& last_error() const override { return inner_.last_error(); }

 private:
  fabric::Transport& inner_;
  int index_;
  fabric::Capabilities caps_;
};

// A region registered on every part; rail i is part i's rail 0.
class SplitRegion final : public fabric::MemoryRegion {
 public:
  explicit SplitRegion(std::vector<std::unique_ptr<fabric::MemoryRegion>> parts)
      : parts_(std::move(parts)) {}
  void* data() const override { return parts_[0]->data(); }
  size_t size() const override { return parts_[0]->size(); }
  fabric::MemoryKind kind() const override { return parts_[0]->kind(); }
  void* local_desc(int rail) const override {
    return parts_[static_cast<size_t>(rail)]->local_desc(0);
  }
  fabric::RegionDescriptor descriptor() const override {
    fabric::RegionDescriptor combined{parts_[0]->size(), {}};
    for (const auto& part : parts_)
      combined.rails.push_back(part->descriptor().rails[0]);
    return combined;
  }

 private:
  std::vector<std::unique_ptr<fabric::MemoryRegion>> parts_;
};

class SplitFabric final : public fabric::Fabric {
 public:
  explicit SplitFabric(std::vector<std::unique_ptr<fabric::Fabric>> parts)
      : parts_(std::move(parts)) {
    for (size_t i = 0; i < parts_.size(); ++i)
      rails_.push_back(std::make_unique<RenamedRail>(parts_[i]->rail(0), static_cast<int>(i),
                                                     "split-domain-" + std::to_string(i)));
  }
  const fabric::Capabilities& capabilities() const override { return rails_[0]->capabilities(); }
  int num_rails() const override { return static_cast<int>(rails_.size()); }
  fabric::Transport& rail(int index) override { return *rails_[static_cast<size_t>(index)]; }
  fabric::Bytes addresses() const override { return {}; }  // parts are connected directly
  void connect(const std::vector<fabric::Bytes>&) override {}
  std::unique_ptr<fabric::MemoryRegion> register_memory(void* data, size_t size,
                                                        fabric::MemoryKind kind) override {
    std::vector<std::unique_ptr<fabric::MemoryRegion>> regions;
    for (auto& part : parts_)
      regions.push_back(part->register_memory(data, size, kind));
    return std::make_unique<SplitRegion>(std::move(regions));
  }
  std::optional<fabric::ReorderStats> reorder_stats() const override {
    std::optional<fabric::ReorderStats> sum;
    for (const auto& part : parts_) {
      auto stats = part->reorder_stats();
      if (!stats) continue;
      if (!sum) sum.emplace();
      *sum += *stats;
    }
    return sum;
  }
  void progress() override {
    for (auto& part : parts_)
      part->progress();
  }
  // Rail i of this fabric is rail 0 of part i.
  void open_connections(const std::vector<ConnectionProbe>& probes) override {
    for (size_t i = 0; i < parts_.size(); ++i) {
      std::vector<ConnectionProbe> own;
      for (const ConnectionProbe& probe : probes)
        own.push_back({probe.peer, {probe.rails.at(i)}});
      parts_[i]->open_connections(own);
    }
  }
  bool connections_open() override {
    bool open = true;
    for (auto& part : parts_)
      open = part->connections_open() && open;
    return open;
  }
  std::vector<int> peers_awaiting_connection() const override {
    std::vector<int> peers;
    for (const auto& part : parts_)
      for (int peer : part->peers_awaiting_connection())
        peers.push_back(peer);
    return peers;
  }
  fabric::Fabric& part(size_t index) { return *parts_[index]; }

 private:
  std::vector<std::unique_ptr<fabric::Fabric>> parts_;
  std::vector<std::unique_ptr<RenamedRail>> rails_;
};

}  // namespace proxyep::proxy::testing
