// deep_ep.Config and the class-wide num_sms, with DeepEP's argument names, defaults and checks
// (integrations/config.hpp), and the Buffer's static size hints.
#include "bindings.hpp"

#include "integrations/buffer.hpp"
#include "integrations/config.hpp"

namespace py = pybind11;

namespace proxyep::python {

void bind_config(py::module_& m) {
  py::class_<Config>(m, "Config")
      .def(py::init(&Config::make), py::arg("num_sms") = 20,
           py::arg("num_max_nvl_chunked_send_tokens") = 6,
           py::arg("num_max_nvl_chunked_recv_tokens") = 256,
           py::arg("num_max_rdma_chunked_send_tokens") = 6,
           py::arg("num_max_rdma_chunked_recv_tokens") = 256)
      .def_readonly("num_sms", &Config::num_sms)
      .def_readonly("num_max_nvl_chunked_send_tokens", &Config::num_max_nvl_chunked_send_tokens)
      .def_readonly("num_max_nvl_chunked_recv_tokens", &Config::num_max_nvl_chunked_recv_tokens)
      .def_readonly("num_max_rdma_chunked_send_tokens", &Config::num_max_rdma_chunked_send_tokens)
      .def_readonly("num_max_rdma_chunked_recv_tokens", &Config::num_max_rdma_chunked_recv_tokens)
      .def("get_nvl_buffer_size_hint", &Config::get_nvl_buffer_size_hint, py::arg("hidden_bytes"),
           py::arg("num_ranks"))
      .def("get_rdma_buffer_size_hint", &Config::get_rdma_buffer_size_hint, py::arg("hidden_bytes"),
           py::arg("num_ranks"))
      .def("__repr__", [](const Config& c) {
        return "Config(num_sms=" + std::to_string(c.num_sms) +
               ", num_max_nvl_chunked_send_tokens=" +
               std::to_string(c.num_max_nvl_chunked_send_tokens) +
               ", num_max_nvl_chunked_recv_tokens=" +
               std::to_string(c.num_max_nvl_chunked_recv_tokens) +
               ", num_max_rdma_chunked_send_tokens=" +
               std::to_string(c.num_max_rdma_chunked_send_tokens) +
               ", num_max_rdma_chunked_recv_tokens=" +
               std::to_string(c.num_max_rdma_chunked_recv_tokens) + ")";
      });
  m.def("get_num_sms", &get_num_sms);
  m.def("set_num_sms", &set_num_sms, py::arg("new_num_sms"));
  m.def("get_dispatch_config", &get_dispatch_config, py::arg("num_ranks"));
  m.def("get_combine_config", &get_combine_config, py::arg("num_ranks"));
  m.def("get_low_latency_rdma_size_hint", &Buffer::get_low_latency_rdma_size_hint,
        py::arg("num_max_dispatch_tokens_per_rank"), py::arg("hidden"), py::arg("num_ranks"),
        py::arg("num_experts"));
  m.def("nvl_bytes_hint", &Buffer::nvl_bytes_hint, py::arg("max_tokens_per_rank"),
        py::arg("hidden_bytes"), py::arg("num_topk"), py::arg("num_ranks"));
  m.def("rdma_bytes_hint", &Buffer::rdma_bytes_hint, py::arg("max_tokens_per_rank"),
        py::arg("hidden_bytes"), py::arg("num_topk"), py::arg("num_ranks"),
        py::arg("ranks_per_node"));
}

}  // namespace proxyep::python
