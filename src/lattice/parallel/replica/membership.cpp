// Membership: see membership.hpp.
#include "lattice/parallel/replica/membership.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "lattice/core/error.hpp"

namespace lattice::replica {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kPoll{20};

// "0, 2, 3".
std::string group_list(const std::vector<int>& groups) {
  std::string text;
  for (int g : groups) text += (text.empty() ? "" : ", ") + std::to_string(g);
  return text.empty() ? "none" : text;
}

// The group ids of the keys under `prefix` (their last path part).
std::map<int, std::string> by_group(const std::vector<KeyValue>& keys, const std::string& prefix) {
  std::map<int, std::string> out;
  for (const KeyValue& kv : keys) {
    try {
      out[std::stoi(kv.key.substr(prefix.size()))] = kv.value;
    } catch (const std::exception&) {  // not a group's key: not ours
    }
  }
  return out;
}

}  // namespace

Membership::Membership(MembershipSettings settings)
    : settings_(std::move(settings)),
      base_("/lattice/" + settings_.job + "/diloco/"),
      store_(settings_.store) {
  const int64_t ttl = settings_.lease_seconds;
  lease_ = store_.grant_lease(ttl);
  const std::string me = "replica group " + std::to_string(settings_.group);
  // One group at a time looks at the job's keys and joins (the lock is under this group's lease:
  // a group killed while holding it frees it within the timeout). A key of this group's id that
  // is still alive is a predecessor killed moments ago (its lease runs out) or a twin (it never
  // does): wait out one lease's life before calling it a twin.
  const auto twin_deadline = Clock::now() + std::chrono::seconds(2 * ttl + 1);
  while (true) {
    const auto deadline = Clock::now() + settings_.timeout;
    while (!store_.create(base_ + "lock", std::to_string(settings_.group), lease_)) {
      check(Clock::now() < deadline,
            me + ": another group of job '" + settings_.job + "' held the store's start lock for " +
                std::to_string(settings_.timeout.count()) +
                " ms: check that the store is not shared with a stuck job, or use another "
                "replica.job");
      std::this_thread::sleep_for(kPoll);
    }
    try {
      const std::vector<int> alive = alive_groups();
      if (std::find(alive.begin(), alive.end(), settings_.group) != alive.end()) {
        store_.remove(base_ + "lock");
        check(Clock::now() < twin_deadline,
              me + " of job '" + settings_.job +
                  "' is already running: give this one another replica.group (or "
                  "--replica-group), or stop the other");
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (!store_.keep_alive(lease_)) lease_ = store_.grant_lease(ttl);  // while it waits
        continue;
      }
      if (alive.empty()) {  // nobody of this job alive: what is there is a finished job's
        store_.remove_prefix(base_ + "round/");
        store_.remove_prefix(base_ + "link/");
        store_.remove(base_ + "latest");
        store_.remove(base_ + "fingerprint");
      }
      const json mine = {{"fingerprint", std::to_string(settings_.fingerprint)},
                         {"group", settings_.group}};
      if (!store_.create(base_ + "fingerprint", mine.dump())) {
        const json theirs = json::parse(store_.get(base_ + "fingerprint").value_or("{}"));
        check(theirs.value("fingerprint", std::string()) == mine["fingerprint"],
              me + " runs another model, layout, batch or optimizer than group " +
                  std::to_string(theirs.value("group", -1)) + " of job '" + settings_.job +
                  "': start every group with the same config (only [job], [replica], "
                  "[checkpoint], [metrics], [data], training.threads and parallelism.backend / "
                  "offload_dir may differ)");
      }
      store_.put(base_ + "alive/" + std::to_string(settings_.group), "1", lease_);
      store_.remove(base_ + "lock");
      break;
    } catch (...) {
      try {
        store_.revoke_lease(lease_);  // frees the lock
      } catch (const Error&) {
      }
      throw;
    }
  }
  heartbeat_ = std::thread([this] { heartbeat(); });
}

Membership::~Membership() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  heartbeat_.join();
  try {
    store_.revoke_lease(lease_);
  } catch (const Error&) {  // the store is gone: the lease runs out by itself
  }
}

void Membership::heartbeat() {
  EtcdClient store(settings_.store);  // its own connection per call, from this thread
  const auto period = std::chrono::milliseconds(settings_.lease_seconds * 1000 / 4);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, period, [this] { return stop_; })) {
    const int64_t lease = lease_;
    lock.unlock();
    try {
      if (!store.keep_alive(lease)) {  // expired: this group was taken for dead; come back
        const int64_t renewed = store.grant_lease(settings_.lease_seconds);
        store.put(base_ + "alive/" + std::to_string(settings_.group), "1", renewed);
        lock.lock();
        lease_ = renewed;
        continue;
      }
    } catch (const Error&) {  // the store is unreachable: the next agreement says so
    }
    lock.lock();
  }
}

std::string Membership::round_key(int64_t round, int attempt) const {
  return base_ + "round/" + std::to_string(round) + "/" + std::to_string(attempt) + "/";
}

std::vector<int> Membership::alive_groups() {
  const std::string prefix = base_ + "alive/";
  std::vector<int> out;
  for (const auto& [group, value] : by_group(store_.get_prefix(prefix), prefix))
    out.push_back(group);
  return out;
}

std::optional<QuorumRecord> Membership::latest() {
  const std::optional<std::string> text = store_.get(base_ + "latest");
  if (!text) return std::nullopt;
  return QuorumRecord::from_json(*text, "the store's key " + base_ + "latest");
}

std::optional<QuorumRecord> Membership::agree(int64_t round, bool contributor,
                                              const std::optional<QuorumRecord>& committed) {
  const int me = settings_.group;
  for (int attempt = 0;; ++attempt) {
    const std::string at = round_key(round, attempt);
    if (store_.get(at + "outcome").value_or("") == "abort") continue;
    const std::optional<std::string> earlier = store_.get(at + "decided");
    if (earlier) {  // agreed before this group came: it takes part only if named
      QuorumRecord r = QuorumRecord::from_json(*earlier, "the store's key " + at + "decided");
      if (r.has(me)) return r;
      if (committed_without_me(at, r)) return std::nullopt;
      continue;
    }
    store_.put(at + "posted/" + std::to_string(me), contributor ? "contributor" : "joiner");
    const auto posted_at = Clock::now();
    while (true) {
      if (const auto decided = store_.get(at + "decided")) {
        QuorumRecord r = QuorumRecord::from_json(*decided, "the store's key " + at + "decided");
        if (r.has(me)) return r;
        if (committed_without_me(at, r)) return std::nullopt;  // it stalled past the timeout
        break;                                                 // that attempt failed: the next
      }
      const std::vector<int> alive = alive_groups();
      const std::map<int, std::string> posted =
          by_group(store_.get_prefix(at + "posted/"), at + "posted/");
      std::optional<QuorumRecord> previous = latest();
      if (!previous) previous = committed;
      const bool timed_out = Clock::now() - posted_at > settings_.timeout;
      // The job's start: no earlier outer step had members (every group holds the same state).
      const bool start = !previous || previous->members.empty();
      // Only a group that holds the job's state decides (a joiner waits for one), or any at the
      // start.
      if (!contributor && !start) {
        const bool holder_alive =
            previous && std::any_of(previous->members.begin(), previous->members.end(), [&](int g) {
              return std::find(alive.begin(), alive.end(), g) != alive.end();
            });
        check(holder_alive || !timed_out,
              "replica group " + std::to_string(me) + " came to join outer step " +
                  std::to_string(round) + " of job '" + settings_.job +
                  "', but no live group holds the job's state (the last outer step's groups: " +
                  group_list(previous ? previous->members : std::vector<int>{}) +
                  "): restart every group from its last checkpoint (checkpoint.resume_from)");
        std::this_thread::sleep_for(kPoll);
        continue;
      }
      std::vector<int> members, contributors;
      bool all_posted = true;
      for (int g : alive) {
        const auto p = posted.find(g);
        if (p == posted.end()) {
          all_posted = false;
          continue;
        }
        members.push_back(g);
        if (p->second == "contributor") contributors.push_back(g);
      }
      const bool everyone_came = !start || static_cast<int>(members.size()) >= settings_.groups;
      if (!(all_posted && everyone_came) && !timed_out) {
        std::this_thread::sleep_for(kPoll);
        continue;
      }
      if (static_cast<int>(members.size()) < settings_.min_groups) {
        check(!timed_out,
              "outer step " + std::to_string(round) + " of job '" + settings_.job + "': only " +
                  std::to_string(members.size()) + " of the " + std::to_string(settings_.groups) +
                  " replica groups came within " + std::to_string(settings_.timeout.count()) +
                  " ms (groups " + group_list(members) +
                  "), and replica.min_groups = " + std::to_string(settings_.min_groups) +
                  ": start the missing groups, or lower replica.min_groups");
        std::this_thread::sleep_for(kPoll);
        continue;
      }
      QuorumRecord r = next_record(previous, round, attempt, members, contributors);
      check(start || !r.contributors.empty(),
            "outer step " + std::to_string(round) + " of job '" + settings_.job +
                "': none of the live groups (" + group_list(members) +
                ") holds the job's state: restart every group from its last checkpoint");
      store_.create(at + "decided", r.to_json());  // the first writer's record is the one
    }
  }
}

bool Membership::committed_without_me(const std::string& at, const QuorumRecord& record) {
  // The members settle within their exchange and the timeout; members that all died say nothing.
  while (true) {
    const std::optional<std::string> outcome = store_.get(at + "outcome");
    if (outcome) return *outcome == "commit";
    const std::vector<int> alive = alive_groups();
    if (std::none_of(record.members.begin(), record.members.end(), [&](int g) {
          return std::find(alive.begin(), alive.end(), g) != alive.end();
        }))
      store_.create(at + "outcome", "abort");
    else
      std::this_thread::sleep_for(kPoll);
  }
}

bool Membership::settle(const QuorumRecord& record, bool succeeded) {
  const std::string at = round_key(record.round, record.attempt);
  store_.put(at + "ok/" + std::to_string(settings_.group), succeeded ? "1" : "0");
  const auto posted_at = Clock::now();
  while (true) {
    if (const auto outcome = store_.get(at + "outcome")) {
      if (*outcome != "commit") return false;
      store_.put(base_ + "latest", record.to_json());  // every member writes the same
      if (record.round >= 2)                           // what no group reads any more
        store_.remove_prefix(base_ + "round/" + std::to_string(record.round - 2) + "/");
      return true;
    }
    const std::map<int, std::string> oks = by_group(store_.get_prefix(at + "ok/"), at + "ok/");
    const std::vector<int> alive = alive_groups();
    bool all_ok = true, failed = false;
    for (int g : record.members) {
      const auto ok = oks.find(g);
      if (ok == oks.end()) {
        all_ok = false;
        // A member that died before saying: the exchange cannot have completed for everyone.
        failed |= std::find(alive.begin(), alive.end(), g) == alive.end();
      } else {
        all_ok &= ok->second == "1";
        failed |= ok->second != "1";
      }
    }
    if (all_ok)
      store_.create(at + "outcome", "commit");
    else if (failed || Clock::now() - posted_at > settings_.timeout)
      store_.create(at + "outcome", "abort");
    else
      std::this_thread::sleep_for(kPoll);
  }
}

}  // namespace lattice::replica
