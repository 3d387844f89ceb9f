#include "proxy/engine/route_completion.hpp"

#include <fmt/format.h>

namespace proxyep::proxy {

Status route_completion(control::ImmSink& sink, const fabric::Completion& completion) {
  if (completion.kind != fabric::Completion::Kind::remote_write)
    return sink.refuse(fmt::format("local_write completion (cookie {}, peer {}) is not a signal",
                                   completion.cookie, completion.peer));
  return sink.route(completion.imm);
}

}  // namespace proxyep::proxy
