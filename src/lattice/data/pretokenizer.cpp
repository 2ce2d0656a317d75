// Pre-tokenizer: see pretokenizer.hpp.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "lattice/data/pretokenizer.hpp"

#include <pcre2.h>

#include "lattice/core/error.hpp"

namespace lattice::data {
namespace {

std::string pcre2_message(int error_code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(error_code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

pcre2_code* as_code(void* code) {
  return static_cast<pcre2_code*>(code);
}

}  // namespace

Pretokenizer::Pretokenizer(std::string_view pattern) : pattern_(pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // UCP: \s, \d, \w follow Unicode, as in the regex engines GPT-2, tiktoken and Hugging Face use.
  // MATCH_INVALID_UTF: bytes that are not UTF-8 match nothing instead of failing the whole match.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code,
                                   &error_offset, nullptr);
  check(code != nullptr, "pre-tokenizer pattern '" + pattern_ + "' does not compile at offset " +
                             std::to_string(error_offset) + ": " + pcre2_message(error_code) +
                             "; fix the pattern (PCRE2 syntax)");
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without JIT (unsupported CPU) it still matches
  code_ = code;
}

Pretokenizer::~Pretokenizer() {
  pcre2_code_free(as_code(code_));
}

std::vector<std::string_view> Pretokenizer::pieces(std::string_view text) const {
  std::vector<std::string_view> out;
  split(text, [&](std::string_view piece) { out.push_back(piece); });
  return out;
}

Pretokenizer::Matcher::Matcher(const Pretokenizer& pretokenizer, std::string_view text)
    : pretokenizer_(pretokenizer),
      text_(text),
      match_data_(pcre2_match_data_create_from_pattern(as_code(pretokenizer.code_), nullptr)) {
  check(match_data_ != nullptr, "pre-tokenizer: out of memory for PCRE2 match data");
}

Pretokenizer::Matcher::~Matcher() {
  pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_));
}

bool Pretokenizer::Matcher::next(std::string_view& piece) {
  if (position_ >= text_.size()) return false;
  if (!has_match_ && !exhausted_) {
    auto* data = static_cast<pcre2_match_data*>(match_data_);
    const int rc =
        pcre2_match(as_code(pretokenizer_.code_), reinterpret_cast<PCRE2_SPTR>(text_.data()),
                    text_.size(), position_, 0, data, nullptr);
    if (rc >= 0) {
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
      match_start_ = ovector[0];
      match_end_ = ovector[1];
      // A pattern that can match the empty string would stall here: take one byte instead.
      if (match_end_ == match_start_) match_end_ = match_start_ + 1;
      has_match_ = true;
    } else {
      check(rc == PCRE2_ERROR_NOMATCH, "pre-tokenizer pattern '" + pretokenizer_.pattern_ +
                                           "' failed to match: " + pcre2_message(rc) +
                                           "; simplify the pattern");
      exhausted_ = true;
    }
  }
  size_t end;
  if (has_match_ && match_start_ == position_) {
    end = match_end_;
    has_match_ = false;
  } else {  // bytes no match covers (not UTF-8): a piece of their own
    end = has_match_ ? match_start_ : text_.size();
  }
  piece = text_.substr(position_, end - position_);
  position_ = end;
  return true;
}

}  // namespace lattice::data
