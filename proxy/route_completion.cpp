#include "proxy/route_completion.hpp"

#include <fmt/format.h>

namespace proxyep::proxy {

Status route_completion(control::SignalRouter& router, const fabric::Completion& completion) {
  if (completion.kind != fabric::Completion::Kind::remote_write)
    return router.refuse(fmt::format("local_write completion (cookie {}, peer {}) is not a signal",
                                     completion.cookie, completion.peer));
  return router.route(completion.imm);
}

}  // namespace proxyep::proxy
