// integrations/rma_link.hpp for Python (python/proxyep/rl/weights/*.py): RmaReceiver and
// RmaSender with the fabric options from the parameter registry (PROXYEP_FABRIC_PROVIDER,
// PROXYEP_FABRIC_REORDER, ... apply). Every call that waits or drives the fabric releases the
// GIL, so a worker's weight-service thread can wait for a transfer while its model decodes.
//
// Memory: the landing area reaches torch as a uint8 tensor over the receiver's own memory (no
// copy); the tensor holds the receiver alive, so close() never frees memory a tensor still
// views (the fabric then stays open until the last such tensor goes). Source regions are torch
// tensors given as (owner, data_ptr, nbytes): the sender holds `owner` until it is closed.
#include "bindings.hpp"
#include "tensor_bridge.hpp"

#include "common/error.hpp"
#include "integrations/rma_link.hpp"

#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace py = pybind11;

namespace proxyep::python {
namespace {

using GilRelease = py::gil_scoped_release;

py::bytes to_bytes(const fabric::Bytes& b) {
  return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
}

fabric::Bytes from_bytes(const py::bytes& b) {
  std::string s = b;
  return fabric::Bytes(s.begin(), s.end());
}

py::object stats_dict(const std::optional<fabric::ReorderStats>& s) {
  if (!s) return py::none();
  py::dict d;
  d["writes"] = s->writes;
  d["split_writes"] = s->split_writes;
  d["segments"] = s->segments;
  d["segments_out_of_order"] = s->segments_out_of_order;
  d["remote_out_of_order"] = s->remote_out_of_order;
  d["local_out_of_order"] = s->local_out_of_order;
  return d;
}

// The Python objects hold the links through shared pointers: a call in flight (GIL released)
// and a landing tensor each keep their own reference, so close() from another thread or while
// tensors live is safe.
template <typename Link>
std::shared_ptr<Link> open_link(const std::shared_ptr<Link>& link, const char* what) {
  require(link != nullptr, "rma", "the {} was closed", what);
  return link;
}

struct PyReceiver {
  std::shared_ptr<RmaReceiver> link;
  std::shared_ptr<RmaReceiver> get() const { return open_link(link, "RmaReceiver"); }
};

struct PySender {
  std::shared_ptr<RmaSender> link;
  std::vector<py::object> owners;  // the tensors behind registered regions
  std::shared_ptr<RmaSender> get() const { return open_link(link, "RmaSender"); }
};

// (offset, length, remote_offset, imm) of one write in a batch.
using WriteSpec = std::tuple<uint64_t, uint64_t, uint64_t, uint32_t>;

void bind_receiver(py::module_& m) {
  py::class_<PyReceiver>(m, "RmaReceiver")
      .def(py::init([](size_t bytes, const std::string& peer) {
             GilRelease unlocked;  // opening a fabric queries the providers
             return PyReceiver{std::make_shared<RmaReceiver>(bytes, peer)};
           }),
           py::arg("bytes"), py::arg("peer"))
      .def("address", [](const PyReceiver& r) { return to_bytes(r.get()->address()); })
      .def("descriptor", [](const PyReceiver& r) { return to_bytes(r.get()->descriptor()); })
      .def("connect",
           [](const PyReceiver& r, const py::bytes& sender_address) {
             auto link = r.get();
             auto address = from_bytes(sender_address);
             GilRelease unlocked;
             link->connect(address);
           })
      .def("landing",
           [](const PyReceiver& r) {
             // The capsule's owner keeps a reference to the receiver (and so its memory).
             auto link = r.get();
             auto* keep = new std::shared_ptr<RmaReceiver>(link);
             py::capsule owner(
                 keep, [](void* p) { delete static_cast<std::shared_ptr<RmaReceiver>*>(p); });
             return capsule_of_bytes(link->landing(), owner);
           })
      .def(
          "wait",
          [](const PyReceiver& r, uint64_t total, int64_t timeout_ms, const std::string& phase) {
            auto link = r.get();
            GilRelease unlocked;
            return link->wait(total, timeout_ms, phase);
          },
          py::arg("total"), py::arg("timeout_ms"), py::arg("phase"))
      .def(
          "wait_some",
          [](const PyReceiver& r, uint64_t total, int64_t timeout_ms, const std::string& phase) {
            auto link = r.get();
            GilRelease unlocked;
            return link->wait_some(total, timeout_ms, phase);
          },
          py::arg("total"), py::arg("timeout_ms"), py::arg("phase"))
      .def(
          "poll",
          [](const PyReceiver& r, const std::string& phase) {
            auto link = r.get();
            GilRelease unlocked;
            return link->poll(phase);
          },
          py::arg("phase"))
      .def_property_readonly("received", [](const PyReceiver& r) { return r.get()->received(); })
      .def_property_readonly("provider",
                             [](const PyReceiver& r) { return r.get()->capabilities().provider; })
      .def("reorder_stats",
           [](const PyReceiver& r) { return stats_dict(r.get()->reorder_stats()); })
      .def("close", [](PyReceiver& r) { r.link.reset(); })
      .def_property_readonly("closed", [](const PyReceiver& r) { return r.link == nullptr; });
}

// The sender's connection and its source regions.
void bind_sender_setup(py::class_<PySender>& sender) {
  sender
      .def(py::init([](const std::string& peer) {
             GilRelease unlocked;
             return PySender{std::make_shared<RmaSender>(peer), {}};
           }),
           py::arg("peer"))
      .def("address", [](const PySender& s) { return to_bytes(s.get()->address()); })
      .def("connect",
           [](const PySender& s, const py::bytes& receiver_address) {
             auto link = s.get();
             auto address = from_bytes(receiver_address);
             GilRelease unlocked;
             link->connect(address);
           })
      .def(
          "register",
          [](PySender& s, py::object owner, uintptr_t data, size_t nbytes) {
            auto link = s.get();
            int id = link->register_region(reinterpret_cast<void*>(data), nbytes);
            s.owners.push_back(std::move(owner));
            return id;
          },
          py::arg("owner"), py::arg("data_ptr"), py::arg("nbytes"))
      .def("add_remote",
           [](const PySender& s, const py::bytes& descriptor) {
             return s.get()->add_remote(from_bytes(descriptor));
           })
      .def_property_readonly("max_write_bytes",
                             [](const PySender& s) { return s.get()->max_write_bytes(); });
}

// Writes and their completion, each waiting with the GIL released.
void bind_sender_writes(py::class_<PySender>& sender) {
  sender
      .def(
          "write",
          [](const PySender& s, int region, uint64_t offset, uint64_t length, int remote,
             uint64_t remote_offset, uint32_t imm, int64_t timeout_ms, const std::string& phase) {
            auto link = s.get();
            GilRelease unlocked;
            link->write(region, offset, length, remote, remote_offset, imm, timeout_ms, phase);
          },
          py::arg("region"), py::arg("offset"), py::arg("length"), py::arg("remote"),
          py::arg("remote_offset"), py::arg("imm"), py::arg("timeout_ms"), py::arg("phase"))
      .def(
          "write_batch",
          [](const PySender& s, int region, int remote, const std::vector<WriteSpec>& writes,
             int64_t timeout_ms, const std::string& phase) {
            // One call for a bucket of writes: one GIL release, no per-write Python overhead.
            // The timeout bounds each write's wait for fabric resources.
            auto link = s.get();
            GilRelease unlocked;
            for (const auto& [offset, length, remote_offset, imm] : writes)
              link->write(region, offset, length, remote, remote_offset, imm, timeout_ms, phase);
          },
          py::arg("region"), py::arg("remote"), py::arg("writes"), py::arg("timeout_ms"),
          py::arg("phase"))
      .def(
          "flush",
          [](const PySender& s, int64_t timeout_ms, const std::string& phase) {
            auto link = s.get();
            GilRelease unlocked;
            link->flush(timeout_ms, phase);
          },
          py::arg("timeout_ms"), py::arg("phase"))
      .def(
          "flush_some",
          [](const PySender& s, int64_t timeout_ms, const std::string& phase) {
            auto link = s.get();
            GilRelease unlocked;
            return link->flush_some(timeout_ms, phase);
          },
          py::arg("timeout_ms"), py::arg("phase"));
}

// What the sender did, and its end.
void bind_sender_state(py::class_<PySender>& sender) {
  sender.def_property_readonly("posted", [](const PySender& s) { return s.get()->posted(); })
      .def_property_readonly("completed", [](const PySender& s) { return s.get()->completed(); })
      .def_property_readonly("bytes_posted",
                             [](const PySender& s) { return s.get()->bytes_posted(); })
      .def_property_readonly("provider",
                             [](const PySender& s) { return s.get()->capabilities().provider; })
      .def("reorder_stats", [](const PySender& s) { return stats_dict(s.get()->reorder_stats()); })
      .def("close",
           [](PySender& s) {
             if (s.link == nullptr) return;
             // The source tensors may be dropped only once no write can read them: refuse while
             // a call on another thread still holds the link.
             require(s.link.use_count() == 1, "rma", "the RmaSender is in use by another thread");
             auto link = std::move(s.link);
             {
               GilRelease unlocked;
               link.reset();
             }
             s.owners.clear();
           })
      .def_property_readonly("closed", [](const PySender& s) { return s.link == nullptr; });
}

}  // namespace

void bind_rma_link(py::module_& m) {
  bind_receiver(m);
  py::class_<PySender> sender(m, "RmaSender");
  bind_sender_setup(sender);
  bind_sender_writes(sender);
  bind_sender_state(sender);
}

}  // namespace proxyep::python
