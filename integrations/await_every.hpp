// await_every: the protocols' most common wait, "until `done(r)` holds for every rank r", with
// the session's deadline; the ranks still pending are named when it expires. With `on_lost`
// (rank masking), a lost or late rank is offered to it instead (proxy::Wait::on_lost).
#pragma once

#include "proxy/session/session.hpp"

#include <functional>
#include <string>
#include <string_view>

namespace proxyep::integrations {

template <typename Done>
void await_every(proxy::Session& session, Done&& done, std::string_view phase,
                 std::string_view what, std::function<bool(int, const std::string&)> on_lost = {}) {
  const int R = session.ranks();
  session.await({.ready =
                     [&] {
                       for (int r = 0; r < R; ++r)
                         if (!done(r)) return false;
                       return true;
                     },
                 .pending = [&](int r) { return !done(r); },
                 .phase = phase,
                 .what = what,
                 .detail = {},
                 .on_lost = std::move(on_lost)});
}

}  // namespace proxyep::integrations
