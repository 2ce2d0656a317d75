#!/usr/bin/env python3
"""Checks that the model, the trainer, the parallelisms and the optimizer reach kernels only through
the backend-neutral kernel interface.

Every op a layer, the optimizer, ZeRO or the gradient norm computes goes through kernels::Ops
(src/lattice/kernels/ops.hpp), made by kernels/make_ops.hpp, so a CUDA backend is a new folder
beside kernels/cpu/, not a change to them. This script scans the .hpp and .cpp files of
src/lattice/model/, src/lattice/train/, src/lattice/parallel/ and src/lattice/optim/ with
their subfolders, and fails, naming each file:line, on
  - an #include of a header in a backend's folder (lattice/kernels/<folder>/..., e.g. cpu/), and
  - a kernels:: name (written kernels::X, lattice::kernels::X, or through a namespace alias of
    either, e.g. `namespace k = lattice::kernels;` then k::X) whose X is not declared at namespace
    scope in lattice::kernels by a top-level header src/lattice/kernels/*.hpp (the backend-neutral
    ones: ops.hpp, precision.hpp, attention_shape.hpp, ...), and
  - a `using namespace` of lattice::kernels (it would hide kernels:: names from this check), and
  - a raw memory operation (memcpy, memset, memmove, std::copy, std::copy_n, std::fill,
    std::fill_n): tensors live in the backend's memory, so their bytes move through
    DeviceMemory (allocate, zero, release, copy, copy_rows: Ops::memory()) or an op
    (Ops::copy, fill_zero, fill); only the files in HOST_DATA, which work on host data by what
    they are, may use them.
Comments and string literals are ignored. Usage: check_model_uses_ops.py [SOURCE_DIR] (default:
the repository this script is in).
"""
import os
import re
import sys

# The folders checked (under src/lattice/), and whether their subfolders are too.
CHECKED = [("model", True), ("train", True), ("parallel", True), ("optim", True)]

# Files allowed to use the CPU backend directly (paths under src/lattice/), each with its reason.
ALLOWED = {
    # The host parameter store's own upkeep: it zeroes the gradients and rounds the bf16 copies of
    # the values in host memory (kernels/cpu/elementwise.hpp, convert.hpp). A device-resident store
    # is the CUDA backend's issue.
    "model/parameter_store.cpp",
}

# Files whose raw memory operations move host data by what they are (paths under src/lattice/),
# each with its reason. Any other file of the checked folders moves tensor bytes through the
# backend's DeviceMemory or an Ops call.
HOST_DATA = {
    # Token ids as the data loader and the benchmark hand them out (host batches; the model moves
    # them to the backend's memory itself: model/stage_activations.hpp, stage_ids).
    "train/trainer.cpp": "the data loader's token batches",
    "train/train_benchmark.cpp": "the benchmark's token batches",
    "parallel/context/sequence_split.cpp": "this cp rank's share of the loader's token ids",
    # The model state gathered whole for a checkpoint, an export or a pipeline's whole state:
    # host buffers the files are written from. Their sources are the store's values, host memory
    # on the CPU backend; a device backend stages them to the host first (its issue).
    "parallel/tensor_parallel_state.cpp": "tensor-parallel slices placed in the gathered state",
    "parallel/expert_parallel_state.cpp": "expert-parallel parameters placed in the gathered state",
    "train/pipeline_rank.cpp": "the pipeline stages' parameters placed in the whole state",
    "train/sharded_checkpoint.cpp": "the index's text packed into a tensor's bytes",
    # Hugging Face weights reordered in the host buffers import reads into and export writes from.
    "train/hf_deepseek.cpp": "DeepSeek's rope rows reordered in the host buffers of import/export",
    # The offloaded AdamW state is host memory and files by definition (ZeRO-Offload).
    "optim/offload_adamw_state.cpp": "the offloaded state's host buffers",
    "optim/offload_header.cpp": "the offload file header's bytes",
    # The caller's host token ids, cut into the pieces a rolling KV cache takes.
    "model/transformer_inference.cpp": "the caller's token ids cut into pieces for the KV cache",
    # Between replica groups everything is host memory: Gloo's TCP buffers and DiLoCo's outer
    # state (train/diloco_sync.cpp stages the store's values through the host).
    "parallel/replica/gloo_link.cpp": "Gloo's host buffers (all-gather of one member)",
    "parallel/replica/outer_optimizer.cpp": "DiLoCo's anchor and momentum, host memory",
    "parallel/replica/outer_codec.cpp": "the outer gradients encoded into Gloo's host buffers",
    "train/diloco_sync.cpp": "the host copies a hand-over packs and the quorum's text",
}

RAW_MEMORY = re.compile(r"(?<![\w.>:])(?:(?:::)?std\s*::\s*(memcpy|memset|memmove|copy|copy_n|fill|fill_n)"
                        r"|::\s*(memcpy|memset|memmove)|(?<!::)\b(memcpy|memset|memmove))\s*\(")

IDENT = r"[A-Za-z_]\w*"
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]lattice/kernels/([^">]+)[">]')
ALIAS = re.compile(r"\bnamespace\s+(" + IDENT + r")\s*=\s*(?:::)?(?:lattice::)?kernels\s*;")
USING_NAMESPACE = re.compile(r"\busing\s+namespace\s+(?:::)?(?:lattice::)?kernels\b")


def strip_comments_and_strings(text):
    """The text with comments and string / character literals blanked, newlines kept."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_preprocessor(text):
    return re.sub(r"(?m)^\s*#.*$", "", text)


def namespace_scope_names(text, namespace="lattice::kernels"):
    """Names a header declares directly in `namespace` (types, enums, aliases, functions,
    variables, nested namespaces), from its comment-free text."""
    names = set()
    stack = []  # per open brace: the namespace it opens, or None for any other scope
    statement = ""

    def current():
        return "::".join(s for s in stack) if all(s is not None for s in stack) else None

    def record(stmt):
        if current() != namespace:
            return
        stmt = re.sub(r"\btemplate\s*<[^{};]*?>", " ", stmt)  # no nested <> in these headers
        m = re.search(r"\b(?:class|struct|union|enum)\s+(?:class\s+|struct\s+)?(" + IDENT + ")",
                      stmt)
        if m:
            names.add(m.group(1))
            return
        m = re.search(r"\busing\s+(" + IDENT + r")\s*=", stmt)
        if m:
            names.add(m.group(1))
            return
        m = re.search(r"\busing\s+[\w:]*::(" + IDENT + r")\s*$", stmt.strip())
        if m:
            names.add(m.group(1))
            return
        m = re.search(r"(" + IDENT + r")\s*\(", stmt)
        if m and not re.search(r"=\s*[^(]*$", stmt[: m.start()]):
            names.add(m.group(1))
            return
        m = re.search(r"(" + IDENT + r")\s*(?:\[[^\]]*\]\s*)*(?:=|\{|$)", stmt.strip())
        if m:
            names.add(m.group(1))

    for c in strip_preprocessor(text):
        if c == "{":
            m = re.search(r"\bnamespace\s+([\w:]*)\s*$", statement)
            if m is not None and current() is not None:
                parts = [p for p in m.group(1).split("::") if p]
                if current() == namespace and parts:
                    names.add(parts[0])  # a nested namespace: its members are reached through it
                stack.append("::".join(parts) if parts else "(anonymous)")
            else:
                record(statement)
                stack.append(None)
            statement = ""
        elif c == "}":
            if stack:
                stack.pop()
            statement = ""
        elif c == ";":
            record(statement)
            statement = ""
        else:
            statement += c
    return names


def neutral_names(kernels_dir):
    names = set()
    for name in sorted(os.listdir(kernels_dir)):
        path = os.path.join(kernels_dir, name)
        if name.endswith(".hpp") and os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                names |= namespace_scope_names(strip_comments_and_strings(f.read()))
    return names


def check_file(path, neutral_headers, allowed_names, host_data=False):
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    problems = []
    for number, line in enumerate(raw.splitlines(), 1):
        m = INCLUDE.match(line)
        if m and m.group(1) not in neutral_headers:
            problems.append((number, "includes lattice/kernels/%s, a backend's header: reach the "
                             "kernels through kernels::Ops (kernels/ops.hpp; made by "
                             "kernels/make_ops.hpp)" % m.group(1)))
    code = strip_comments_and_strings(raw)
    prefixes = {"kernels"} | {m.group(1) for m in ALIAS.finditer(code)}
    qualified = re.compile(r"(?<![\w:])(?:(?:::)?lattice::)?(" + "|".join(sorted(prefixes)) +
                           r")\s*::\s*(" + IDENT + ")")
    for number, line in enumerate(code.splitlines(), 1):
        if USING_NAMESPACE.search(line):
            problems.append((number, "`using namespace` of lattice::kernels: name kernels:: "
                             "explicitly (only the backend-neutral headers' names are allowed)"))
        if not host_data:
            for m in RAW_MEMORY.finditer(line):
                what = next(g for g in m.groups() if g)
                problems.append((number, "%s on raw memory: tensor bytes move through the "
                                 "backend's DeviceMemory (Ops::memory(): copy, copy_rows, zero, "
                                 "release) or an op (Ops::copy, fill_zero, fill); host data by "
                                 "nature belongs in HOST_DATA with its reason" % what))
        for m in qualified.finditer(line):
            if m.group(2) not in allowed_names:
                problems.append((number, "%s::%s is not declared by a backend-neutral header "
                                 "(src/lattice/kernels/*.hpp): compute through kernels::Ops"
                                 % (m.group(1), m.group(2))))
    return problems


def main():
    source = os.path.normpath(sys.argv[1] if len(sys.argv) > 1 else
                              os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    kernels_dir = os.path.join(source, "src", "lattice", "kernels")
    lattice_dir = os.path.join(source, "src", "lattice")
    neutral_headers = {n for n in os.listdir(kernels_dir)
                       if n.endswith(".hpp") and os.path.isfile(os.path.join(kernels_dir, n))}
    allowed_names = neutral_names(kernels_dir)
    if "Ops" not in allowed_names:
        print("check_model_uses_ops: no kernels::Ops declared under " + kernels_dir)
        return 1
    files = []
    for folder, recursive in CHECKED:
        top = os.path.join(lattice_dir, folder)
        found = []
        for root, dirs, names in os.walk(top):
            if not recursive:
                dirs[:] = []
            found += [os.path.relpath(os.path.join(root, n), lattice_dir)
                      for n in names if n.endswith((".hpp", ".cpp"))]
        if not found:
            print("check_model_uses_ops: no sources under " + top)
            return 1
        files += sorted(found)
    failures = 0
    for name in files:
        if name in ALLOWED:
            continue
        path = os.path.join(lattice_dir, name)
        for number, why in check_file(path, neutral_headers, allowed_names, name in HOST_DATA):
            print("%s:%d: %s" % (path, number, why))
            failures += 1
    stale = sorted(n for n in HOST_DATA if n not in files)
    for name in stale:
        print("check_model_uses_ops: HOST_DATA names %s, which is not a checked source: remove it"
              % name)
        failures += 1
    print("check_model_uses_ops: %d files of %s (%d allowed: %s; %d on host data), %d names from "
          "%d backend-neutral headers, %d problems"
          % (len(files), ", ".join(folder + "/" for folder, _ in CHECKED), len(ALLOWED),
             ", ".join(sorted(ALLOWED)), len(HOST_DATA), len(allowed_names),
             len(neutral_headers), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
