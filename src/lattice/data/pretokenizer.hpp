// Pre-tokenizer: splits text into the pieces BPE encodes one at a time, with a regular expression
// (PCRE2, UTF and Unicode-property mode, JIT-compiled). The default is GPT-2's pattern. Text need
// not be valid UTF-8: each maximal run of bytes that are not valid UTF-8 becomes a piece of its
// own, so the pieces always cover the text exactly.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace lattice::data {

// GPT-2's pre-tokenizer pattern (also Hugging Face's ByteLevel and tiktoken's r50k/p50k/gpt2).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class Pretokenizer {
 public:
  // Compiles `pattern`; throws lattice::Error naming the pattern and PCRE2's complaint.
  explicit Pretokenizer(std::string_view pattern = kGpt2Pattern);
  ~Pretokenizer();
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;

  const std::string& pattern() const { return pattern_; }

  // Calls on_piece(piece) for each piece of `text`, in order; the pieces concatenate to `text`.
  // Safe to call from several threads at once.
  template <typename OnPiece>
  void split(std::string_view text, OnPiece&& on_piece) const {
    Matcher matcher(*this, text);
    std::string_view piece;
    while (matcher.next(piece)) on_piece(piece);
  }

  // The pieces of `text` as a vector (for tests and the trainer).
  std::vector<std::string_view> pieces(std::string_view text) const;

  // Walks the pieces of one text; holds the PCRE2 match data of one thread.
  class Matcher {
   public:
    Matcher(const Pretokenizer& pretokenizer, std::string_view text);
    ~Matcher();
    Matcher(const Matcher&) = delete;
    Matcher& operator=(const Matcher&) = delete;
    // The next piece; false at the end of the text.
    bool next(std::string_view& piece);

   private:
    const Pretokenizer& pretokenizer_;
    std::string_view text_;
    size_t position_ = 0;     // start of the next piece
    size_t match_start_ = 0;  // the regex match found ahead (start, end); valid when has_match_
    size_t match_end_ = 0;
    bool has_match_ = false;
    bool exhausted_ = false;  // no match at or after position_
    void* match_data_;        // pcre2_match_data_8*
  };

 private:
  std::string pattern_;
  void* code_;  // pcre2_code_8*
};

}  // namespace lattice::data
