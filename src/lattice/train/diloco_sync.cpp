// DilocoSync: see diloco_sync.hpp.
#include "lattice/train/diloco_sync.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <regex>
#include <set>
#include <sstream>

#include "lattice/core/error.hpp"
#include "lattice/train/checkpoint.hpp"
#include "lattice/train/checkpoint_reader.hpp"

namespace lattice::train {

namespace {

// FNV-1a over the text.
uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

constexpr uint64_t kFnvOffset = 1469598103934665603ull;

// FNV-1a over the 32-bit words of `values`, continuing from `hash`.
uint64_t fnv1a_words(const float* values, size_t n, uint64_t hash) {
  const uint32_t* words = reinterpret_cast<const uint32_t*>(values);
  for (size_t i = 0; i < n; ++i) {
    hash ^= words[i];
    hash *= 1099511628211ull;
  }
  return hash;
}

// "0, 2, 3".
std::string group_list(const std::vector<int>& groups) {
  std::string text;
  for (int g : groups) text += (text.empty() ? "" : ", ") + std::to_string(g);
  return text;
}

}  // namespace

uint64_t replica_fingerprint(const TrainConfig& config) {
  // The resolved config's sections that decide the arithmetic, less the keys a group sets for
  // itself (its kernel threads, its backend, its offload directory, its throughput baseline).
  static const std::set<std::string> shared = {"model",        "training",    "optimizer",
                                               "lr_scheduler", "parallelism", "context_parallel",
                                               "diloco"};
  std::istringstream lines(config.to_toml());
  std::string line, section, kept;
  while (std::getline(lines, line)) {
    if (!line.empty() && line[0] == '[') {  // [section] or [section.table]
      section = line.substr(1, line.find_first_of(".]") - 1);
      continue;
    }
    const auto own = [&line](const char* key) { return line.rfind(key, 0) == 0; };
    if (shared.count(section) && !own("threads") && !own("backend") && !own("offload_dir") &&
        !own("baseline_tokens_per_second"))
      kept += section + ": " + line + "\n";
  }
  kept += "groups=" + std::to_string(config.replica.groups);
  return fnv1a(kept);
}

DilocoSync::DilocoSync(const TrainConfig& config, StepRunner& runner, comm::Communicator& world)
    : config_(config),
      runner_(runner),
      world_(world),
      groups_(static_cast<int>(config.replica.groups)),
      group_(static_cast<int>(config.replica.group)),
      sync_(config.replica.groups > 1 && config.diloco.inner_steps == 0),
      inner_steps_(sync_ ? 1 : config.diloco.inner_steps),
      fragments_(sync_ ? 1 : static_cast<int>(config.diloco.fragments)),
      round_steps_(inner_steps_ / fragments_),
      overlap_(sync_ ? 0 : config.diloco.overlap_steps),
      mixing_(static_cast<float>(config.diloco.mixing)),
      precision_(sync_ ? replica::OuterPrecision::fp32 : config.diloco.exchange) {
  const replica::OuterSettings settings{static_cast<float>(config.diloco.outer_lr),
                                        static_cast<float>(config.diloco.outer_momentum),
                                        config.diloco.nesterov};
  if (groups_ > 1)
    on_leader([&] {
      membership_ = std::make_unique<replica::Membership>(
          replica::MembershipSettings{config.replica.store, config.replica.job, group_, groups_,
                                      static_cast<int>(config.replica.min_groups), timeout(),
                                      config.replica.lease_seconds, replica_fingerprint(config)});
      return std::string("K");
    });
  if (sync_) {  // the gradients meet inside the step, before the norm and the update
    runner_.data_parallel(0).set_gradient_exchange(
        [this](float* gradients, int64_t) { exchange_gradients(gradients); });
    return;  // no outer optimizer
  }
  settle_whole();
  build_fragments();
  std::vector<float> host;
  for (int i = 0; i < runner_.stage_count(); ++i) {
    const model::ParameterStore& store = runner_.stage(i).parameters();
    copy_values(store, host);
    outer_.push_back(
        std::make_unique<replica::OuterOptimizer>(host.data(), store.size(), settings));
  }
}

DilocoSync::~DilocoSync() {
  if (pending_ && pending_->worker.joinable()) pending_->worker.join();
}

int DilocoSync::fragment_of(int64_t round) const {
  return fragments_ == 1 ? 0 : static_cast<int>((round - 1) % fragments_);
}

void DilocoSync::build_fragments() {
  // The model's layers in order: the embedding (0), block i (i + 1), the final norm and head
  // (n_layers + 1), dealt round-robin into the fragments (the paper's strided pattern: each
  // fragment spans the depth of the model).
  const std::regex block(R"(\.(h|layers)\.([0-9]+)\.)");
  const int64_t layers = config_.model.n_layers;
  fragment_ranges_.assign(
      static_cast<size_t>(fragments_),
      std::vector<std::vector<replica::ElementRange>>(static_cast<size_t>(runner_.stage_count())));
  for (int i = 0; i < runner_.stage_count(); ++i) {
    const model::ParameterStore& store = runner_.stage(i).parameters();
    if (fragments_ == 1) {  // the whole store, gaps and all: DiLoCo's outer step as it was
      fragment_ranges_[0][static_cast<size_t>(i)] = {{0, store.size()}};
      continue;
    }
    std::vector<std::pair<int64_t, int>> starts;  // (offset, parameter)
    for (size_t p = 0; p < store.parameters().size(); ++p)
      starts.emplace_back(store.parameters()[p].offset, static_cast<int>(p));
    std::sort(starts.begin(), starts.end());
    for (const auto& [offset, index] : starts) {
      const model::ParameterInfo& info = store.info(index);
      std::smatch m;
      int64_t layer = layers + 1;
      if (std::regex_search(info.name, m, block))
        layer = std::stoll(m[2].str()) + 1;
      else if (info.name.find("wte") != std::string::npos ||
               info.name.find("wpe") != std::string::npos ||
               info.name.find("embed_tokens") != std::string::npos)
        layer = 0;
      std::vector<replica::ElementRange>& ranges =
          fragment_ranges_[static_cast<size_t>(layer % fragments_)][static_cast<size_t>(i)];
      const int64_t end = offset + info.numel;
      if (!ranges.empty() && ranges.back().end == offset)
        ranges.back().end = end;
      else
        ranges.push_back({offset, end});
    }
  }
}

std::chrono::milliseconds DilocoSync::timeout() const {
  return std::chrono::milliseconds(static_cast<int64_t>(config_.replica.timeout_seconds * 1000));
}

void DilocoSync::copy_values(const model::ParameterStore& store, std::vector<float>& host) const {
  host.resize(static_cast<size_t>(store.size()));
  store.memory().copy(host.data(), store.values(), host.size() * sizeof(float),
                      CopyKind::device_to_host);
}

int64_t DilocoSync::outer_steps() const {
  return outer_.empty() ? 0 : outer_[0]->steps_taken();
}

int64_t DilocoSync::bytes_sent() const {
  if (pending_ && pending_->worker.joinable()) return bytes_snapshot_;  // the link is the thread's
  return retired_bytes_ + (link_ ? link_->bytes_sent() : 0);
}

void DilocoSync::settle_whole() {
  for (int i = 0; i < runner_.stage_count(); ++i) runner_.data_parallel(i).settle_parameters(true);
}

std::vector<std::pair<std::string, const float*>> DilocoSync::checkpoint_states(int stage) const {
  if (sync_) return {};
  const replica::OuterOptimizer& outer = *outer_[static_cast<size_t>(stage)];
  return {{"diloco_anchor/", outer.anchor().data()}, {"diloco_momentum/", outer.momentum().data()}};
}

std::string DilocoSync::checkpoint_quorum() const {
  return record_ ? record_->to_json() : std::string();
}

void DilocoSync::resume(const std::string& checkpoint_dir, int64_t step, const std::string& quorum,
                        bool printing) {
  CheckpointReader reader(checkpoint_dir);
  const int64_t outer_steps = step / round_steps_;
  for (int i = 0; !sync_ && i < runner_.stage_count(); ++i) {
    const model::ParameterStore& store = runner_.stage(i).parameters();
    std::vector<float> anchor(static_cast<size_t>(store.size()), 0.0f), momentum(anchor.size());
    const bool has_anchor = read_parameter_state(reader, "diloco_anchor/", store, anchor.data());
    const bool has_momentum =
        read_parameter_state(reader, "diloco_momentum/", store, momentum.data());
    check(has_anchor == has_momentum, "checkpoint " + checkpoint_dir +
                                          " holds half of DiLoCo's outer state: it is damaged; "
                                          "resume from an earlier one (checkpoint.resume_from)");
    if (!has_anchor) {
      if (printing && i == 0)
        std::printf(
            "diloco: checkpoint %s has no outer state; the outer optimizer starts at the "
            "resumed parameters\n",
            checkpoint_dir.c_str());
      continue;  // anchored at the resumed parameters by the constructor
    }
    outer_[static_cast<size_t>(i)]->load(anchor.data(), momentum.data(), outer_steps);
  }
  if (!quorum.empty() && groups_ > 1)
    record_ = replica::QuorumRecord::from_json(
        quorum, "checkpoint " + checkpoint_dir + "'s replica_quorum");
}

std::string DilocoSync::on_leader(const std::function<std::string()>& ask) {
  std::string answer;
  if (world_.rank() == 0) {
    try {
      answer = ask();
    } catch (const std::exception& e) {
      answer = std::string("E") + e.what();
    }
  }
  if (world_.size() > 1) {
    int64_t bytes = static_cast<int64_t>(answer.size());
    world_.broadcast(&bytes, 1, DType::i64, 0);
    // As 32-bit words (the communicators' broadcast moves numbers), the text padded to them.
    std::vector<int32_t> words(static_cast<size_t>((bytes + 3) / 4), 0);
    std::memcpy(words.data(), answer.data(), answer.size());
    if (!words.empty())
      world_.broadcast(words.data(), static_cast<int64_t>(words.size()), DType::i32, 0);
    answer.assign(reinterpret_cast<const char*>(words.data()), static_cast<size_t>(bytes));
  }
  check(!answer.empty(), "replica group " + std::to_string(group_) +
                             ": its first rank gave no answer (internal error)");
  if (answer[0] == 'E') throw Error(answer.substr(1));
  return answer;
}

namespace {

// 'N' for none, else 'R' and the record.
std::string record_answer(const std::optional<replica::QuorumRecord>& record) {
  return record ? "R" + record->to_json() : std::string("N");
}
std::optional<replica::QuorumRecord> record_of(const std::string& answer) {
  if (answer[0] == 'N') return std::nullopt;
  return replica::QuorumRecord::from_json(answer.substr(1), "a quorum record");
}

}  // namespace

std::optional<replica::QuorumRecord> DilocoSync::agree_in_group(
    int64_t round, bool contributor, const std::optional<replica::QuorumRecord>& committed) {
  return record_of(
      on_leader([&] { return record_answer(membership_->agree(round, contributor, committed)); }));
}

bool DilocoSync::settle_in_group(const replica::QuorumRecord& record, bool succeeded) {
  return on_leader([&] {
           return std::string(membership_->settle(record, succeeded) ? "C" : "A");
         }) == "C";
}

bool DilocoSync::everyone(bool mine) {
  int32_t all = mine ? 1 : 0;
  if (world_.size() > 1) world_.allreduce(&all, 1, DType::i32, comm::ReduceOp::min);
  return all == 1;
}

replica::GlooLink& DilocoSync::link_for(const replica::QuorumRecord& record) {
  // The link of the last outer step serves again only among the same members, none of them new
  // (a joiner may be a restart of a member whose old end of the link is dead).
  if (!link_ || link_members_ != record.members || record.contributors != record.members) {
    drop_link();
    const auto at = std::find(record.members.begin(), record.members.end(), group_);
    const std::string prefix = "/lattice/" + config_.replica.job + "/diloco/link/" +
                               std::to_string(record.round) + "/" + std::to_string(record.attempt) +
                               "/rank" + std::to_string(world_.rank()) + "/";
    link_ = std::make_unique<replica::GlooLink>(
        config_.replica.store, prefix, static_cast<int>(at - record.members.begin()),
        static_cast<int>(record.members.size()), config_.replica.host, timeout());
    link_members_ = record.members;
  }
  return *link_;
}

void DilocoSync::drop_link() {
  if (link_) retired_bytes_ += link_->bytes_sent();
  link_.reset();
  link_members_.clear();
}

void DilocoSync::say(const std::string& line) const {
  if (world_.rank() == 0) std::printf("diloco: group %d: %s\n", group_, line.c_str());
}

void DilocoSync::fill_sums(const replica::QuorumRecord& record, const float* gradients) {
  const bool mine = record.contributes(group_);
  sums_.resize(static_cast<size_t>(runner_.stage_count()));
  for (int i = 0; i < runner_.stage_count(); ++i) {
    const model::ParameterStore& store = runner_.stage(i).parameters();
    std::vector<float>& sum = sums_[static_cast<size_t>(i)];
    if (sync_) {  // the gradients this rank holds (one stage: the config refuses a pipeline)
      sum.resize(static_cast<size_t>(runner_.data_parallel(i).held_gradient_elements()));
      if (mine)
        store.memory().copy(sum.data(), gradients, sum.size() * sizeof(float),
                            CopyKind::device_to_host);
      else
        std::fill(sum.begin(), sum.end(), 0.0f);
    } else if (precision_ == replica::OuterPrecision::fp32) {
      sum = captured_[static_cast<size_t>(i)];  // the allreduce sums it in place
    }  // encoded: the sums are decoded from the members' payloads
  }
}

namespace {

// Elements in `ranges`.
int64_t range_elements(const std::vector<replica::ElementRange>& ranges) {
  int64_t n = 0;
  for (const replica::ElementRange& r : ranges) n += r.end - r.begin;
  return n;
}

}  // namespace

void DilocoSync::capture(const replica::QuorumRecord& record, int fragment) {
  settle_whole();
  const bool mine = record.contributes(group_);
  captured_.resize(static_cast<size_t>(runner_.stage_count()));
  payload_.clear();
  std::vector<float> host, delta;
  for (int i = 0; i < runner_.stage_count(); ++i) {
    const std::vector<replica::ElementRange>& ranges =
        fragment_ranges_[static_cast<size_t>(fragment)][static_cast<size_t>(i)];
    std::vector<float>& packed = captured_[static_cast<size_t>(i)];
    packed.assign(static_cast<size_t>(range_elements(ranges)), 0.0f);  // nothing to bring
    if (mine) {
      copy_values(runner_.stage(i).parameters(), host);
      float* at = packed.data();
      for (const replica::ElementRange& r : ranges)
        at = std::copy(host.begin() + r.begin, host.begin() + r.end, at);
    }
    if (precision_ == replica::OuterPrecision::fp32) continue;
    // Encoded: the outer gradient Δ = θ_anchor − θ_local (zeros from a joiner).
    delta.assign(packed.size(), 0.0f);
    if (mine) {
      const std::vector<float>& anchor = outer_[static_cast<size_t>(i)]->anchor();
      size_t k = 0;
      for (const replica::ElementRange& r : ranges)
        for (int64_t j = r.begin; j < r.end; ++j, ++k) delta[k] = anchor[j] - packed[k];
    }
    const size_t at = payload_.size();
    payload_.resize(at + static_cast<size_t>(replica::encoded_bytes(
                             precision_, static_cast<int64_t>(delta.size()))));
    replica::encode(precision_, delta.data(), static_cast<int64_t>(delta.size()),
                    payload_.data() + at);
  }
  // ZeRO-3 gathered every bucket to read them; it goes back to its shards (the same values) so
  // that the steps trained until the round's end run as they would without a capture.
  for (int i = 0; i < runner_.stage_count(); ++i) runner_.data_parallel(i).take_whole_values();
}

void DilocoSync::decode_sums(const uint8_t* blocks, int members) {
  sums_.resize(captured_.size());
  for (int m = 0; m < members; ++m) {  // in member order: the same bits on every member
    const uint8_t* at = blocks + static_cast<size_t>(m) * payload_.size();
    for (size_t i = 0; i < captured_.size(); ++i) {
      const int64_t n = static_cast<int64_t>(captured_[i].size());
      if (m == 0) sums_[i].assign(static_cast<size_t>(n), 0.0f);
      replica::decode_add(precision_, at, n, sums_[i].data());
      at += replica::encoded_bytes(precision_, n);
    }
  }
}

bool DilocoSync::exchange(const replica::QuorumRecord& record) {
  const bool encoded = !sync_ && precision_ != replica::OuterPrecision::fp32;
  // The start has nothing to average; a member alone holds its own sum.
  if (record.contributors.empty() || record.members.size() == 1) {
    drop_link();
    if (encoded && !record.contributors.empty()) decode_sums(payload_.data(), 1);
    return true;
  }
  try {
    replica::GlooLink& link = link_for(record);
    if (encoded) {
      gathered_.resize(payload_.size() * record.members.size());
      link.all_gather(payload_.data(), gathered_.data(), static_cast<int64_t>(payload_.size()));
      decode_sums(gathered_.data(), static_cast<int>(record.members.size()));
    } else {
      for (std::vector<float>& sum : sums_)
        link.allreduce_sum(sum.data(), static_cast<int64_t>(sum.size()));
    }
  } catch (const Error& e) {
    say(round_name() + " " + std::to_string(record.round) + " failed (" + e.what() +
        "); agreeing on it again");
    drop_link();
    return false;
  }
  return true;
}

void DilocoSync::apply_outer_step(const replica::QuorumRecord& record, int fragment) {
  const float contributors = static_cast<float>(record.contributors.size());
  uint64_t hash = kFnvOffset;
  std::vector<float> host;
  for (int i = 0; i < runner_.stage_count(); ++i) {
    model::ParameterStore& store = runner_.stage(i).parameters();
    const std::vector<replica::ElementRange>& ranges =
        fragment_ranges_[static_cast<size_t>(fragment)][static_cast<size_t>(i)];
    std::vector<float>& values = sums_[static_cast<size_t>(i)];
    const int64_t n = static_cast<int64_t>(values.size());
    if (contributors > 1) {  // the contributors' sum over their count (one: its own, untouched)
      float* v = values.data();
#pragma omp parallel for simd schedule(static)
      for (int64_t j = 0; j < n; ++j) v[j] /= contributors;
    }
    replica::OuterOptimizer& outer = *outer_[static_cast<size_t>(i)];
    if (precision_ == replica::OuterPrecision::fp32)
      outer.step(values.data(), ranges);  // from θ̄
    else
      outer.step_delta(values.data(), ranges);  // from the mean Δ
    hash = fnv1a_words(values.data(), values.size(), hash);
    // θ_global into the store's ranges; with overlap mixed with what was trained since.
    copy_values(store, host);
    const float* global = values.data();
    for (const replica::ElementRange& r : ranges) {
      float* local = host.data() + r.begin;
      const int64_t m = r.end - r.begin;
      if (overlap_ > 0) {
        const float alpha = mixing_, beta = 1.0f - mixing_;
#pragma omp parallel for simd schedule(static)
        for (int64_t j = 0; j < m; ++j) local[j] = alpha * local[j] + beta * global[j];
      } else {
        std::copy(global, global + m, local);
      }
      global += m;
    }
    store.memory().copy(store.mutable_values(), host.data(), host.size() * sizeof(float),
                        CopyKind::host_to_device);
    runner_.data_parallel(i).take_whole_values();  // ZeRO-3: its shards of the new values
  }
  last_.weights_hash = hash;
}

bool DilocoSync::hand_over_state(const replica::QuorumRecord& record) {
  const bool needed =
      !record.contributors.empty() && std::any_of(record.members.begin(), record.members.end(),
                                                  [&](int g) { return !record.contributes(g); });
  if (!needed) return true;
  const bool receiving = !record.contributes(group_), sending = group_ == record.source;
  const int root =
      static_cast<int>(std::find(record.members.begin(), record.members.end(), record.source) -
                       record.members.begin());
  uint64_t hash = kFnvOffset;
  if (sending) settle_whole();  // ZeRO-3: the whole values to copy
  std::vector<float> values;
  try {
    check(link_ != nullptr, "no link to the source (internal error)");
    for (int i = 0; i < runner_.stage_count(); ++i) {
      model::ParameterStore& store = runner_.stage(i).parameters();
      parallel::ShardedAdamW& adamw = runner_.data_parallel(i).optimizer();
      replica::OuterOptimizer* outer = sync_ ? nullptr : outer_[static_cast<size_t>(i)].get();
      const size_t n = static_cast<size_t>(store.size()),
                   s = static_cast<size_t>(adamw.state_elements());
      // [values | anchor | momentum | exp_avg | exp_avg_sq] and the two step counts.
      std::vector<float> state(3 * n + 2 * s);
      int64_t steps[2] = {adamw.steps_taken(), outer ? outer->steps_taken() : 0};
      if (sending) {
        copy_values(store, values);
        std::copy(values.begin(), values.end(), state.begin());
        if (outer) {
          std::copy(outer->anchor().begin(), outer->anchor().end(), state.begin() + n);
          std::copy(outer->momentum().begin(), outer->momentum().end(), state.begin() + 2 * n);
        }
        adamw.copy_state(state.data() + 3 * n, state.data() + 3 * n + s);
      }
      link_->broadcast(state.data(), static_cast<int64_t>(state.size() * sizeof(float)), root);
      link_->broadcast(steps, sizeof(steps), root);
      if (!receiving) continue;
      store.memory().copy(store.mutable_values(), state.data(), n * sizeof(float),
                          CopyKind::host_to_device);
      runner_.data_parallel(i).take_whole_values();
      adamw.load_state(state.data() + 3 * n, state.data() + 3 * n + s, steps[0]);
      if (outer) outer->load(state.data() + n, state.data() + 2 * n, steps[1]);
      hash = fnv1a_words(state.data(), n, hash);
    }
  } catch (const Error& e) {
    if (receiving)
      say("the job's state did not arrive at " + round_name() + " " + std::to_string(record.round) +
          " (" + e.what() + "); joining the next one");
    drop_link();
    return !receiving;
  }
  if (receiving) last_.weights_hash = hash;
  if (sending || receiving) {
    std::vector<int> receivers;
    for (int g : record.members)
      if (!record.contributes(g)) receivers.push_back(g);
    const std::string fnv = " (state fnv " + std::to_string(state_hash()) + ")";
    if (sending)
      say("handed the job's state to groups " + group_list(receivers) + " at " + round_name() +
          " " + std::to_string(record.round) + fnv);
    else
      say("took the job's state at " + round_name() + " " + std::to_string(record.round) +
          " from group " + std::to_string(record.source) + fnv);
  }
  return true;
}

uint64_t DilocoSync::state_hash() {
  settle_whole();
  uint64_t hash = kFnvOffset;
  std::vector<float> values;
  for (int i = 0; i < runner_.stage_count(); ++i) {
    const parallel::ShardedAdamW& adamw = runner_.data_parallel(i).optimizer();
    copy_values(runner_.stage(i).parameters(), values);
    hash = fnv1a_words(values.data(), values.size(), hash);
    int64_t outer_steps = 0;
    if (!sync_) {
      const replica::OuterOptimizer& outer = *outer_[static_cast<size_t>(i)];
      hash = fnv1a_words(outer.anchor().data(), outer.anchor().size(), hash);
      hash = fnv1a_words(outer.momentum().data(), outer.momentum().size(), hash);
      outer_steps = outer.steps_taken();
    }
    std::vector<float> m(static_cast<size_t>(adamw.state_elements())), v(m.size());
    adamw.copy_state(m.data(), v.data());
    hash = fnv1a_words(m.data(), m.size(), hash);
    hash = fnv1a_words(v.data(), v.size(), hash);
    const float steps[2] = {static_cast<float>(adamw.steps_taken()),
                            static_cast<float>(outer_steps)};
    hash = fnv1a_words(steps, 2, hash);
  }
  return hash;
}

void DilocoSync::report(const replica::QuorumRecord& record, bool joined) {
  last_.members = record.members;
  last_.contributors = record.contributors;
  last_.completed = record.completed;
  last_.joined = joined;
  last_.completed_block = -1;
  for (size_t i = 0; i < record.contributors.size(); ++i)
    if (record.contributors[i] == group_) last_.completed_block = record.completed[i];
  last_.next_block = record.block_of(group_);
  if (!record_ || record_->members != record.members)
    say(round_name() + " " + std::to_string(record.round) + " with groups " +
        group_list(record.members) + " of " + std::to_string(groups_) +
        (joined ? ", this one joining" : ""));
  record_ = record;
}

RoundStart DilocoSync::join(int64_t step) {
  if (groups_ == 1) return {step, std::nullopt};
  const std::optional<replica::QuorumRecord> latest =
      record_of(on_leader([&] { return record_answer(membership_->latest()); }));
  if (record_) {  // resumed with the record of its last outer step
    if (latest && latest->round > record_->round) {
      say("the job went on past this group's checkpoint (outer step " +
          std::to_string(record_->round) + ", the job's " + std::to_string(latest->round) +
          "): joining at the next outer step");
      return join_running(latest->round + 1);
    }
    return {step, std::nullopt};  // trains on to its next outer step, where it brings its block
  }
  if (latest) return join_running(latest->round + 1);  // a running job
  // The job's start (or the whole job resumed from checkpoints without a record): every group
  // holds the same state; the blocks are handed out from the first one not yet read.
  replica::QuorumRecord before;
  before.round = step / round_steps_ - 1;
  before.next_block = (step + round_steps_ - 1) / round_steps_;
  const int64_t round = step / round_steps_;
  while (true) {
    const std::optional<replica::QuorumRecord> r = agree_in_group(round, false, before);
    if (!r) return join_running(round + 1);    // the others started without this group
    if (!settle_in_group(*r, true)) continue;  // agreed on again
    report(*r, false);
    return {step, r->block_of(group_)};
  }
}

RoundStart DilocoSync::join_running(int64_t round) {
  while (true) {
    const std::optional<replica::QuorumRecord> r = agree_in_group(round, false, record_);
    if (!r) {  // it went on without this group: the next one
      ++round;
      continue;
    }
    if (!sync_) capture(*r, fragment_of(r->round));  // zeros: nothing to bring
    fill_sums(*r, nullptr);
    const bool exchanged = everyone(exchange(*r));
    if (!settle_in_group(*r, exchanged)) continue;  // agreed on again, without the failed
    if (!everyone(hand_over_state(*r))) {
      ++round;
      continue;
    }
    report(*r, true);
    return {r->round * round_steps_, r->block_of(group_)};
  }
}

void DilocoSync::exchange_gradients(float* gradients) {
  const int64_t round = record_->round + 1;  // one per step
  while (true) {
    const std::optional<replica::QuorumRecord> r =
        agree_in_group(round, record_->has(group_), record_);
    check(r.has_value(),
          "replica group " + std::to_string(group_) + " was left out of step " +
              std::to_string(round) +
              " (it came later than replica.timeout_seconds): start it again, and it joins the "
              "running job");
    fill_sums(*r, gradients);
    const bool exchanged = everyone(exchange(*r));
    if (!settle_in_group(*r, exchanged)) continue;  // agreed on again, without the failed
    // The mean over the groups that brought gradients, back where the update reads it.
    std::vector<float>& sum = sums_[0];
    const float contributors = static_cast<float>(r->contributors.size());
    if (contributors > 1) {
      float* v = sum.data();
      const int64_t n = static_cast<int64_t>(sum.size());
#pragma omp parallel for simd schedule(static)
      for (int64_t j = 0; j < n; ++j) v[j] /= contributors;
    }
    runner_.stage(0).parameters().memory().copy(gradients, sum.data(), sum.size() * sizeof(float),
                                                CopyKind::host_to_device);
    exchanged_ = r;
    return;
  }
}

std::optional<RoundStart> DilocoSync::after_step(int64_t step) {
  if (sync_) {  // the step's exchange is done: hand the updated state to the joiners
    check(exchanged_.has_value(), "step " + std::to_string(step) +
                                      " had no exchange between the replica groups (internal "
                                      "error)");
    const replica::QuorumRecord r = *exchanged_;
    exchanged_.reset();
    if (!everyone(hand_over_state(r))) return join_running(step + 1);
    if (config_.parallelism.zero < 3) {  // the updated weights, whole on every rank (ZeRO-3: not
      runner_.data_parallel(0).settle_parameters(false);  // without a gather, so no hash)
      std::vector<float> values;
      copy_values(runner_.stage(0).parameters(), values);
      last_.weights_hash = fnv1a_words(values.data(), values.size(), kFnvOffset);
    }
    report(r, false);
    return RoundStart{step, r.block_of(group_)};
  }
  if (starts_at(step) && !pending_) {
    const std::optional<RoundStart> left_out = start_round((step + overlap_) / round_steps_);
    if (left_out) return left_out;
  }
  if (!exchanges_at(step)) return std::nullopt;
  // A round whose start this group did not see (resumed from a checkpoint inside the overlap):
  // it starts now, without overlap.
  if (!pending_) {
    const std::optional<RoundStart> left_out = start_round(step / round_steps_);
    if (left_out) return left_out;
  }
  return finish_round(step);
}

std::optional<RoundStart> DilocoSync::start_round(int64_t round) {
  const int fragment = fragment_of(round);
  pending_ = std::make_unique<Pending>();
  pending_->fragment = fragment;
  pending_->bytes_before = bytes_sent();
  if (groups_ == 1) {  // its own outer step on its own parameters; the data goes on as it is
    pending_->record.members = pending_->record.contributors = {group_};
    capture(pending_->record, fragment);
    return std::nullopt;
  }
  const bool contributor = record_ && record_->has(group_);
  const std::optional<replica::QuorumRecord> r = agree_in_group(round, contributor, record_);
  if (!r) {
    pending_.reset();
    say("outer step " + std::to_string(round) +
        " went on without this group (it came later than replica.timeout_seconds): joining "
        "the next one");
    return join_running(round + 1);
  }
  pending_->record = *r;
  capture(*r, fragment);
  fill_sums(*r, nullptr);
  if (overlap_ > 0) {  // the exchange runs while the group trains the next τ steps
    bytes_snapshot_ = pending_->bytes_before;
    Pending* p = pending_.get();
    p->worker = std::thread([this, p] {
      try {
        p->exchanged = exchange(p->record);
      } catch (const std::exception& e) {  // exchange() turns the link's failures into false
        say(std::string("the exchange's thread failed: ") + e.what());
        p->exchanged = false;
      }
    });
  }
  return std::nullopt;
}

std::optional<RoundStart> DilocoSync::finish_round(int64_t step) {
  Pending& p = *pending_;
  if (groups_ == 1) {
    fill_sums(p.record, nullptr);
    exchange(p.record);  // encoded: its own Δ decoded
    settle_whole();      // ZeRO-3: the whole values the outer step is mixed into
    apply_outer_step(p.record, p.fragment);
    pending_.reset();
    return std::nullopt;
  }
  bool exchanged;
  if (p.worker.joinable()) {
    p.worker.join();
    exchanged = p.exchanged;
  } else {
    exchanged = exchange(p.record);
  }
  replica::QuorumRecord r = p.record;
  const bool contributor = record_ && record_->has(group_);
  while (!settle_in_group(r, everyone(exchanged))) {  // agreed on again, without the failed
    const std::optional<replica::QuorumRecord> again =
        agree_in_group(r.round, contributor, record_);
    if (!again) {
      pending_.reset();
      say("outer step " + std::to_string(r.round) +
          " went on without this group (it came later than replica.timeout_seconds): joining "
          "the next one");
      return join_running(r.round + 1);
    }
    r = *again;
    fill_sums(r, nullptr);  // from what was captured at the round's start
    exchanged = exchange(r);
  }
  const bool brought = r.contributes(group_);
  settle_whole();
  if (brought) apply_outer_step(r, p.fragment);
  const int64_t bytes_before = p.bytes_before;
  pending_.reset();
  if (!everyone(hand_over_state(r))) return join_running(r.round + 1);
  report(r, !brought);
  last_.round_bytes = bytes_sent() - bytes_before;
  peak_round_bytes_ = std::max(peak_round_bytes_, last_.round_bytes);
  last_.peak_round_bytes = peak_round_bytes_;
  return RoundStart{step, r.block_of(group_)};
}

}  // namespace lattice::train
