// Credential lists: parsing (spaces, empty entries, duplicates, garbage, overflow), the
// defaults (own uid and root), allow by uid or by gid, and the refusal naming both sides.
#include "common/error.hpp"
#include "daemon/access_policy.hpp"

#include <doctest/doctest.h>

using namespace proxyep;
using namespace proxyep::daemon;

TEST_CASE("id lists parse with spaces, empty entries and duplicates") {
  CHECK(parse_id_list("", "x").empty());
  CHECK(parse_id_list(" , ,", "x").empty());
  CHECK(parse_id_list("0,1000, 1001 ,1000", "x") == std::vector<uint32_t>{0, 1000, 1001});
  CHECK(parse_id_list("4294967295", "x") == std::vector<uint32_t>{4294967295u});
}

TEST_CASE("id lists refuse names, signs and ids beyond 32 bits, naming the parameter") {
  CHECK_THROWS_WITH_AS(parse_id_list("0,alice", "daemon.allow_uids"),
                       "daemon.access: daemon.allow_uids = '0,alice': 'alice' is not a numeric "
                       "id (ids separated by commas)",
                       Error);
  CHECK_THROWS_AS(parse_id_list("-1", "x"), Error);
  CHECK_THROWS_AS(parse_id_list("1 2", "x"), Error);
  CHECK_THROWS_WITH_AS(parse_id_list("4294967296", "x"), doctest::Contains("beyond 32 bits"),
                       Error);
  CHECK_THROWS_WITH_AS(parse_id_list("99999999999999999999999", "daemon.allow_uids"),
                       "daemon.access: daemon.allow_uids = '99999999999999999999999': id "
                       "99999999999999999999999 is beyond 32 bits",
                       Error);
}

TEST_CASE("an empty uid list means the daemon's own uid and root") {
  const AccessPolicy own = AccessPolicy::from_lists("", "", 1000);
  CHECK(own.uids() == std::vector<uint32_t>{0, 1000});
  CHECK(own.gids().empty());
  CHECK(own.refusal({1, 1000, 1000}).empty());
  CHECK(own.refusal({1, 0, 5}).empty());
  CHECK_FALSE(own.refusal({1, 1001, 1000}).empty());  // gid 1000 is not allowed by default
  const AccessPolicy root = AccessPolicy::from_lists("", "", 0);
  CHECK(root.uids() == std::vector<uint32_t>{0});
  CHECK(root.describe() == "uids 0; gids none");
}

TEST_CASE("a peer is served by uid or by gid, and a refusal names both sides") {
  const AccessPolicy policy = AccessPolicy::from_lists("1000", "27,100", 0);
  CHECK(policy.refusal({1, 1000, 1}).empty());
  CHECK(policy.refusal({1, 2000, 27}).empty());
  const std::string why = policy.refusal({1, 65534, 65534});
  CHECK(why ==
        "uid 65534 (gid 65534) may not use this proxyepd: it serves uids 1000 and gids 27, 100 "
        "(daemon.allow_uids, daemon.allow_gids)");
  CHECK(policy.refusal({1, 0, 0}).find("uid 0") != std::string::npos);  // root only if listed
}
