// DilocoSync: DiLoCo on one trainer rank (Douillard et al. 2023), the synchronous replica groups
// (diloco.inner_steps = 0: the gradients averaged across the groups every step, before the norm
// and the update, like HSDP's replicas), and the replica groups' fault tolerance around both. Each
// replica group trains on its own (any layout, its own AdamW); after every diloco.inner_steps (H)
// steps the groups agree on who takes part (replica::Membership, through the group's first rank: a
// group that died, or stalled past replica.timeout_seconds, is left out), each rank averages the
// parameters it holds with the ranks at the same place of the other members (a GlooLink per rank
// position, made afresh when the members change) and applies the outer step
// (replica::OuterOptimizer), so every member continues from the same parameters. The step commits
// only when every member's exchange succeeded; otherwise it is agreed on again without the failed
// ones, from the same parameters. A group that joins a running job (a new one, or one restarted
// after it died) takes part in the next outer step with nothing to average and receives the result,
// its AdamW state and the outer state from a live member, then trains on from there. The data is
// one stream cut into blocks of H steps of one group, handed out by the quorum
// (replica::QuorumRecord): a block whose group left before bringing it back is handed out again, so
// no sample is skipped or trained twice. Every stage's whole values take part (ZeRO-3 gathers them
// first and keeps its shards of the result): each rank exchanges 2·(M-1)/M of its 4Ψ bytes per
// outer step and holds the anchor and the momentum (8Ψ) in host memory.
//
// Streaming DiLoCo (Douillard et al. 2025; diloco.fragments, overlap_steps, exchange): the layers
// (the embedding, each block, the head) are dealt round-robin into P fragments, and a round every
// H/P steps synchronises one fragment, so each is synchronised every H steps and one exchange
// carries Ψ/P. Round k ends at step k·H/P; its exchange starts τ steps before (the quorum agreed,
// the fragment's values captured) and runs on a thread of its own while the group trains on; at
// the round's end the outer step is taken from what was captured and mixed into what the group
// trained meanwhile (θ ← α·θ_local + (1−α)·θ_global; the anchor is θ_global). In bf16 or fp4 the
// members send their outer gradients Δ = θ_anchor − θ_local encoded (replica/outer_codec.hpp) to
// each other and each decodes and sums them in fp32. A data block is H/P steps, one per round.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lattice/comm/communicator.hpp"
#include "lattice/parallel/replica/gloo_link.hpp"
#include "lattice/parallel/replica/membership.hpp"
#include "lattice/parallel/replica/outer_optimizer.hpp"
#include "lattice/train/communication_times.hpp"
#include "lattice/train/step_runner.hpp"
#include "lattice/train/train_config.hpp"

namespace lattice::train {

// Where a group trains on from after it joined or took an outer step.
struct RoundStart {
  int64_t step = 0;              // the group's state is that after this step
  std::optional<int64_t> block;  // the data block it trains next (none: where its data stands)
};

class DilocoSync {
 public:
  // Anchors the outer state at the runner's current parameters; with replica.groups > 1 the
  // group's first rank joins the job's store. Collective over this group's ranks (`world`).
  DilocoSync(const TrainConfig& config, StepRunner& runner, comm::Communicator& world);
  ~DilocoSync();

  // Before the first step, at `step` (0, or the resumed step): where the group starts. With one
  // group, where it is. With several: at the job's start the groups meet and take their first
  // blocks; a group that comes to a running job (or whose checkpoint the job has gone past) waits
  // for the next outer step and takes the job's state there. Collective like the constructor.
  RoundStart join(int64_t step);
  // After step `step`: at each multiple of H the outer step, and where the group goes on from
  // (a new data block; a later step when it was left out and joined again). Collective.
  std::optional<RoundStart> after_step(int64_t step);

  // Whether step `step` ends a round (an exchange between the groups: every H-th step, every
  // (H/P)-th with P fragments, every step in the synchronous mode), whether one starts there (τ
  // steps earlier with overlap), and the steps of one data block (those of a round).
  bool exchanges_at(int64_t step) const { return step % round_steps_ == 0; }
  bool starts_at(int64_t step) const { return (step + overlap_) % round_steps_ == 0; }
  int64_t block_steps() const { return round_steps_; }
  // With overlap: the inner steps an exchange runs behind (τ).
  int64_t overlap_steps() const { return overlap_; }

  int64_t outer_steps() const;
  // Bytes this rank has sent to the other groups so far.
  int64_t bytes_sent() const;
  // What the last outer step did (members, blocks, the weights' hash) for the metrics.
  const ReplicaExchange& last_exchange() const { return last_; }

  // Stage i's outer state, laid out as its store's values, for the checkpoint (states named
  // "diloco_anchor/" and "diloco_momentum/" + parameter name).
  std::vector<std::pair<std::string, const float*>> checkpoint_states(int stage) const;
  // The last committed quorum record's JSON, for the checkpoint's state (empty with one group).
  std::string checkpoint_quorum() const;
  // After the trainer resumed from `checkpoint_dir` at `step`: the outer state and the quorum
  // record from it (any layout wrote them); a checkpoint without an outer state (DiLoCo newly
  // switched on) anchors at the resumed parameters with momentum 0, and says so on `printing`
  // ranks.
  void resume(const std::string& checkpoint_dir, int64_t step, const std::string& quorum,
              bool printing);

 private:
  // Every stage's whole parameters, settled (ZeRO-3 gathers them).
  void settle_whole();
  // `store`'s values copied to `host`.
  void copy_values(const model::ParameterStore& store, std::vector<float>& host) const;

  std::chrono::milliseconds timeout() const;
  // The answer of `ask` run on the group's first rank (which holds the membership), on every rank
  // of the group; an error there is thrown on every rank. Collective over the group.
  std::string on_leader(const std::function<std::string()>& ask);
  // Membership::agree and settle through on_leader.
  std::optional<replica::QuorumRecord> agree_in_group(
      int64_t round, bool contributor, const std::optional<replica::QuorumRecord>& committed);
  bool settle_in_group(const replica::QuorumRecord& record, bool succeeded);
  // Whether every rank of the group holds `mine`.
  bool everyone(bool mine);
  // This rank's link among `record`'s members (kept while they stay the same).
  replica::GlooLink& link_for(const replica::QuorumRecord& record);
  void drop_link();
  // One line on the group's first rank.
  void say(const std::string& line) const;
  // The fragment round `round` synchronises (0 with one fragment).
  int fragment_of(int64_t round) const;
  // Each fragment's element ranges in each stage's store (one range, the whole store, with one
  // fragment).
  void build_fragments();
  // captured_ (and payload_ when encoded): fragment `fragment`'s values as this rank holds them
  // now, or zeros when it brings nothing to `record` (a joiner).
  void capture(const replica::QuorumRecord& record, int fragment);
  // sums_ for `record`: what this rank brings (the captured values, or the synchronous mode's
  // `gradients`), or zeros when it brings nothing (a joiner).
  void fill_sums(const replica::QuorumRecord& record, const float* gradients);
  // Sums sums_ over the members (encoded: the members' payloads, decoded); false on a failed link.
  bool exchange(const replica::QuorumRecord& record);
  // sums_ = the sum of `members` payloads laid one after the other in `blocks`, decoded.
  void decode_sums(const uint8_t* blocks, int members);
  // Agrees on round `round` and captures its fragment; with overlap the exchange starts on a
  // thread of its own. A left-out group joins a later round: its RoundStart.
  std::optional<RoundStart> start_round(int64_t round);
  // At step `step`, the end of the round in flight: the exchange finished (agreed on again
  // without a failed member), the outer step, the hand-over to joiners.
  std::optional<RoundStart> finish_round(int64_t step);
  // The synchronous mode, inside the step: `gradients` (what this rank holds) replaced by their
  // mean over the groups, agreed on like an outer step.
  void exchange_gradients(float* gradients);
  std::string round_name() const { return sync_ ? "step" : "outer step"; }
  // The contributors' outer step on fragment `fragment` from sums_, mixed into the parameters
  // trained since the capture (with overlap).
  void apply_outer_step(const replica::QuorumRecord& record, int fragment);
  // The source's state to the members that do not hold it; true where it arrived (or was not
  // needed).
  bool hand_over_state(const replica::QuorumRecord& record);
  // An FNV-1a hash of everything a hand-over moves (this rank's parameters, outer state, AdamW
  // moments and step counts), as this rank holds it now.
  uint64_t state_hash();
  // Joins outer step `round` (or a later one) without parameters to bring, and takes the state.
  RoundStart join_running(int64_t round);
  void report(const replica::QuorumRecord& record, bool joined);

  const TrainConfig& config_;
  StepRunner& runner_;
  comm::Communicator& world_;
  int groups_, group_;
  bool sync_;  // synchronous replica groups: gradients averaged every step (diloco.inner_steps 0)
  int64_t inner_steps_;  // 1 in the synchronous mode
  int fragments_;
  int64_t round_steps_;  // H / P
  int64_t overlap_;      // τ
  float mixing_;         // α
  replica::OuterPrecision precision_;
  // [fragment][stage]: the fragment's element ranges in the stage's store.
  std::vector<std::vector<std::vector<replica::ElementRange>>> fragment_ranges_;
  std::vector<std::vector<float>> captured_;  // per stage: the fragment's values at the capture
  std::vector<uint8_t> payload_, gathered_;   // encoded: this rank's Δ, and every member's
  // The round in flight between its start and its end (with overlap, its exchange's thread).
  struct Pending {
    replica::QuorumRecord record;
    int fragment = 0;
    bool exchanged = false;
    std::thread worker;
    int64_t bytes_before = 0;
  };
  std::unique_ptr<Pending> pending_;
  int64_t bytes_snapshot_ = 0;  // bytes_sent() while an exchange's thread runs
  int64_t peak_round_bytes_ = 0;
  std::optional<replica::QuorumRecord> exchanged_;   // the synchronous step's, until after_step
  std::unique_ptr<replica::Membership> membership_;  // on the group's first rank, groups > 1
  std::unique_ptr<replica::GlooLink> link_;
  std::vector<int> link_members_;
  int64_t retired_bytes_ = 0;                                    // sent over links since replaced
  std::optional<replica::QuorumRecord> record_;                  // the last committed outer step's
  std::vector<std::unique_ptr<replica::OuterOptimizer>> outer_;  // one per stage
  std::vector<std::vector<float>> sums_;                         // per stage, during an outer step
  ReplicaExchange last_;
};

// A fingerprint of what every replica group must share: the model, the layout, the batch and the
// DiLoCo settings (the groups' own keys, such as replica.group, left out).
uint64_t replica_fingerprint(const TrainConfig& config);

}  // namespace lattice::train
