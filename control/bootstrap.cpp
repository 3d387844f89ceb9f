#include "control/bootstrap.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/params.hpp"
#include "control/job_credentials.hpp"
#include "control/tcp_bootstrap.hpp"

namespace proxyep::control {

std::unique_ptr<Bootstrap> Bootstrap::connect(Options options) {
  return std::make_unique<TcpBootstrap>(std::move(options));
}

Bootstrap::Options Bootstrap::options_for(LaunchEnv env) {
  Options options;
  options.env = std::move(env);
  log::set_rank(options.env.rank);
  auto timeout_ms = params::bootstrap_timeout_ms.get();
  require(timeout_ms > 0, "bootstrap.env",
          "bootstrap.timeout_ms (PROXYEP_BOOTSTRAP_TIMEOUT_MS) "
          "must be positive, got {}",
          timeout_ms);
  options.timeout = std::chrono::milliseconds(timeout_ms);
  options.listen_address = params::bootstrap_interface.get();
  auto credentials = JobCredentials::from_environment();
  options.job_id = std::move(credentials.job_id);
  options.secret = std::move(credentials.secret);
  return options;
}

std::unique_ptr<Bootstrap> Bootstrap::from_environment(std::function<void()> progress) {
  Options options = options_for(LaunchEnv::from_environment());
  options.progress = std::move(progress);
  return connect(std::move(options));
}

}  // namespace proxyep::control
