// Mesh axes by name, and a small set of them. Header only, with no dependency on communicators:
// parameter placements (model::ParameterStore) name the axes a parameter is replicated over with
// an AxisSet, and the Mesh (mesh.hpp) hands out one communicator per axis.
//   pp, dp, cp, tp: the four axes whose product is the world (rank order tp-cp-dp-pp);
//   ep: expert parallelism, carved out of dp x cp (adds no ranks);
//   dp_replicate, dp_shard: dp split for HSDP (torchtitan's ParallelDims): dp = dp_replicate x
//     dp_shard with dp_shard innermost, so the ranks that shard the state are consecutive dp ranks.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace lattice::mesh {

enum class Axis : uint8_t { pp, dp, cp, tp, ep, dp_replicate, dp_shard };
inline constexpr std::array<Axis, 7> kAllAxes = {
    Axis::pp, Axis::dp, Axis::cp, Axis::tp, Axis::ep, Axis::dp_replicate, Axis::dp_shard};

constexpr std::string_view axis_name(Axis axis) {
  switch (axis) {
    case Axis::pp:
      return "pp";
    case Axis::dp:
      return "dp";
    case Axis::cp:
      return "cp";
    case Axis::tp:
      return "tp";
    case Axis::ep:
      return "ep";
    case Axis::dp_replicate:
      return "dp_replicate";
    case Axis::dp_shard:
      return "dp_shard";
  }
  return "?";
}

// The axis of that name, or nullopt.
inline std::optional<Axis> axis_from_name(std::string_view name) {
  for (Axis axis : kAllAxes)
    if (axis_name(axis) == name) return axis;
  return std::nullopt;
}

// A set of mesh axes (one bit per Axis).
class AxisSet {
 public:
  constexpr AxisSet() = default;
  constexpr AxisSet(std::initializer_list<Axis> axes) {
    for (Axis a : axes) bits_ |= bit(a);
  }
  static constexpr AxisSet all() {
    AxisSet s;
    for (Axis a : kAllAxes) s.bits_ |= bit(a);
    return s;
  }
  static constexpr AxisSet from_bits(uint32_t bits) {
    AxisSet s;
    s.bits_ = bits & all().bits_;
    return s;
  }

  constexpr bool contains(Axis axis) const { return (bits_ & bit(axis)) != 0; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr AxisSet with(Axis axis) const { return from_bits(bits_ | bit(axis)); }
  constexpr AxisSet without(Axis axis) const { return from_bits(bits_ & ~bit(axis)); }
  // Every axis not in this set.
  constexpr AxisSet complement() const { return from_bits(~bits_); }
  constexpr uint32_t bits() const { return bits_; }
  constexpr bool operator==(const AxisSet&) const = default;

  // "dp,cp,tp" in kAllAxes order ("" for the empty set).
  std::string names() const {
    std::string out;
    for (Axis a : kAllAxes)
      if (contains(a)) out += (out.empty() ? "" : ",") + std::string(axis_name(a));
    return out;
  }

 private:
  static constexpr uint32_t bit(Axis axis) { return uint32_t{1} << static_cast<unsigned>(axis); }
  uint32_t bits_ = 0;
};

// Number of distinct AxisSets (every subset of kAllAxes).
inline constexpr uint32_t kAxisSetCount = uint32_t{1} << kAllAxes.size();

}  // namespace lattice::mesh
