// prepare_dataset: what `lattice data prepare` does — text files cut into documents (one per file,
// or split on a separator), encoded by several threads, each document preceded by the tokenizer's
// end-of-text token, split into training and validation documents, written as llm.c shards with a
// manifest.json into a directory that appears whole (staged, then renamed) or not at all. The
// output does not depend on the thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lattice/data/dataset_manifest.hpp"

namespace lattice::data {

struct PrepareOptions {
  std::vector<std::string> inputs;                       // files or glob patterns
  std::vector<std::string> exclude = {"*.dat", "*.u8"};  // file names to skip (fnmatch)
  std::string tokenizer = "byte";                        // a load_tokenizer spec
  std::string out;                                       // the dataset directory
  std::string separator;       // empty: one document per file; else the text between documents
  double val_fraction = 0.05;  // share of documents in the validation split
  int64_t shard_tokens = 100'000'000;
  int threads = 0;  // 0: every core
};

// Progress: bytes of text encoded so far out of the total.
using PrepareProgress = std::function<void(int64_t done_bytes, int64_t total_bytes)>;

// Which of `documents` documents are validation: exactly round(fraction · documents) of them (at
// least one when fraction > 0 and there are two or more documents), chosen by a hash of the
// document index, so the split is spread over the corpus and fixed.
std::vector<bool> validation_documents(int64_t documents, double fraction);

// Turns "\n%\n"-style escapes (\n, \t, \r, \\) of a command-line separator into the text.
std::string unescape_separator(const std::string& text);

DatasetManifest prepare_dataset(const PrepareOptions& options,
                                const PrepareProgress& progress = nullptr);

}  // namespace lattice::data
