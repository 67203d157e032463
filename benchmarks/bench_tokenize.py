"""Tokenization and token counting against the bare cost of parsing the same JSON lines.

Builds the tiny target (its real byte-level BPE tokenizer and ChatML template with thinking
markers, trained on data/prompts/default.jsonl) and a synthetic `raw_responses.jsonl` of about
--size-mb MB (default 50; the seed run's tokenized file is 174 MB): conversations that end with
the assistant's response, some with reasoning_content and some with two turns, in the words of
the bundled prompts. Then times

1. `eaglenest.data.tokenize.tokenize_stage` (render, tokenize, mask, count, write) against
   reading + `json.loads` of every line of raw_responses.jsonl;
2. token counting (the counts over loss-masked ids that token_freq.pt holds) against reading
   + `json.loads` of every line of the resulting tokenized_data.jsonl: counting from the file
   (parse + numpy mask + bincount), counting alone on parsed rows (numpy, the way the stage
   does it per 256-row chunk), and, for scale, a pure-Python loop on the same rows.

3. the whole stage with 1 and 2 worker processes (`tokenize.processes`, the rule's threads):
   wall time, MB/s, and whether the three outputs are the same bytes.

Goal (issue 8): token counting runs at no less than half the speed of merely parsing the file.
Usage: python benchmarks/bench_tokenize.py [--size-mb 50] [--work DIR] [--repeat 3] [--processes 1,2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import numpy as np

REPO = Path(__file__).resolve().parents[1]
PROMPTS = REPO / "data" / "prompts" / "default.jsonl"


def build_target(out_dir: Path) -> Path:
    from eaglenest.target.tiny import build_tiny_target

    if not (out_dir / "tokenizer.json").exists():
        build_tiny_target(out_dir, [PROMPTS])
    return out_dir


def synth_responses(path: Path, size_mb: float, seed: int = 0) -> int:
    """Write conversations until the file holds size_mb MB; return the row count."""
    rng = random.Random(seed)
    prompts = [json.loads(line)["messages"][0]["content"] for line in PROMPTS.open()]
    words = sorted({w for p in prompts for w in p.split()})
    target = int(size_mb * 1e6)

    def text(n_words: int) -> str:
        out, k = [], 0
        while k < n_words:
            sentence = rng.choices(words, k=rng.randint(6, 18))
            sentence[0] = sentence[0].capitalize()
            out.append(" ".join(sentence) + rng.choice([".", ".", ".", "?", ":\n\n- ", ".\n\n"]))
            k += len(sentence)
        return " ".join(out)

    written = rows = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            messages = []
            if rng.random() < 0.2:
                messages.append({"role": "system", "content": "You are a helpful assistant."})
            turns = 2 if rng.random() < 0.2 else 1
            for _t in range(turns):
                messages.append({"role": "user", "content": rng.choice(prompts)})
                reply = {
                    "role": "assistant",
                    "content": text(int(rng.lognormvariate(5.6, 0.6))),
                }  # ~300 words
                if rng.random() < 0.3:
                    reply["reasoning_content"] = text(int(rng.lognormvariate(4.8, 0.5)))
                messages.append(reply)
            line = json.dumps({"id": f"r{rows}", "messages": messages}, ensure_ascii=False) + "\n"
            f.write(line)
            written += len(line.encode("utf-8"))
            rows += 1
    return rows


def best_of(fn, repeat: int):
    """Best wall and best CPU seconds (this process, all threads) of `repeat` runs, result.

    CPU seconds hardly move when other processes compete for the cores; wall seconds do."""
    wall = cpu = float("inf")
    result = None
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        wall = min(wall, time.perf_counter() - w0)
        cpu = min(cpu, time.process_time() - c0)
    return wall, cpu, result


def parse_only(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        for line in f:
            json.loads(line)
            n += 1
    return n


def count_from_file(path: Path, vocab: int) -> np.ndarray:
    """Parse every row (json.loads) and count its loss-masked ids with numpy."""
    counts = np.zeros(vocab, dtype=np.int64)
    with open(path, "rb") as f:
        for line in f:
            row = json.loads(line)
            ids = np.array(row["input_ids"], dtype=np.int64)
            counts += np.bincount(ids[np.array(row["loss_mask"], dtype=bool)], minlength=vocab)
    return counts


def count_from_text(path: Path, vocab: int) -> np.ndarray:
    """Count without json: numpy parses the "input_ids" list text and the 0/1 mask bytes of
    each line as the stage writes them ({"id":..,"input_ids":[..],"loss_mask":[..]})."""
    ids_parts, mask_parts = [], []
    with open(path, "rb") as f:
        for line in f:
            i = line.index(b'"input_ids":[') + 13
            j = line.index(b"]", i)
            k = line.index(b'"loss_mask":[', j) + 13
            m = line.index(b"]", k)
            ids_parts.append(np.fromstring(line[i:j], dtype=np.int64, sep=","))
            mask_parts.append(np.frombuffer(line[k:m:2], dtype=np.uint8) == ord("1"))
    ids = np.concatenate(ids_parts)
    return np.bincount(ids[np.concatenate(mask_parts)], minlength=vocab)


def load_rows(path: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    rows = []
    with open(path, "rb") as f:
        for line in f:
            row = json.loads(line)
            rows.append(
                (np.asarray(row["input_ids"], dtype=np.int64), np.asarray(row["loss_mask"], dtype=np.uint8))
            )
    return rows


def count_numpy(rows, vocab: int, chunk: int = 256) -> np.ndarray:
    """What tokenize_stage does per chunk of 256 rows: ids[mask], concatenate, bincount."""
    counts = np.zeros(vocab, dtype=np.int64)
    for i in range(0, len(rows), chunk):
        masked = [ids[mask.astype(bool)] for ids, mask in rows[i : i + chunk]]
        counts += np.bincount(np.concatenate(masked), minlength=vocab)
    return counts


def count_python(rows_lists, vocab: int) -> np.ndarray:
    c = Counter()
    for ids, mask in rows_lists:
        for t, m in zip(ids, mask):
            if m:
                c[t] += 1
    counts = np.zeros(vocab, dtype=np.int64)
    for t, n in c.items():
        counts[t] = n
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=50.0)
    parser.add_argument("--work", type=Path, default=None, help="keep files here (default: temp)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of the cheap timings")
    parser.add_argument("--max-seq-len", type=int, default=8192)
    parser.add_argument(
        "--processes", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2],
        help="worker-process counts to time the stage with (comma-separated; the first is the reference)",
    )  # fmt: skip
    args = parser.parse_args()

    import torch

    from eaglenest.data.tokenize import tokenize_stage

    tmp = None
    if args.work is None:
        tmp = tempfile.mkdtemp(prefix="bench_tokenize_")
        work = Path(tmp)
    else:
        work = args.work
        work.mkdir(parents=True, exist_ok=True)
    try:
        t_build = time.perf_counter()
        target = build_target(work / "target")
        t_build = time.perf_counter() - t_build
        raw = work / "raw_responses.jsonl"
        if not raw.exists() or abs(raw.stat().st_size / 1e6 - args.size_mb) > 1:
            rows = synth_responses(raw, args.size_mb)
        else:
            rows = sum(1 for _ in raw.open("rb"))
        raw_mb = raw.stat().st_size / 1e6
        out = work / "tokenized"
        out.mkdir(exist_ok=True)
        data, freq, meta_path = out / "tokenized_data.jsonl", out / "token_freq.pt", out / "metadata.json"

        t_parse_raw = best_of(lambda: parse_only(raw), args.repeat)
        t_tok = best_of(
            lambda: tokenize_stage(raw, target, args.max_seq_len, "truncate", data, freq, meta_path), 1
        )
        meta = t_tok[2]
        # The stage with 1 and more worker processes: wall time, and the outputs' bytes.
        scaling = []
        for procs in args.processes:
            d = work / f"tokenized-{procs}p"
            d.mkdir(exist_ok=True)
            files = (d / "tokenized_data.jsonl", d / "token_freq.pt", d / "metadata.json")
            wall = best_of(
                lambda p=procs, f=files: tokenize_stage(
                    raw, target, args.max_seq_len, "truncate", *f, processes=p
                ),
                1,
            )[0]
            scaling.append((procs, wall, [hashlib.sha256(f.read_bytes()).hexdigest() for f in files]))
        tok_mb = data.stat().st_size / 1e6
        vocab = meta["target_vocab_size"]

        t_parse_tok = best_of(lambda: parse_only(data), args.repeat)
        t_count_file = best_of(lambda: count_from_file(data, vocab), args.repeat)
        t_count_text = best_of(lambda: count_from_text(data, vocab), args.repeat)
        rows_np = load_rows(data)
        t_count_np = best_of(lambda: count_numpy(rows_np, vocab), args.repeat)
        # The Python loop on a slice (it is slow), scaled to the whole file.
        sub = max(1, len(rows_np) // 10)
        rows_lists = [(ids.tolist(), mask.tolist()) for ids, mask in rows_np[:sub]]
        scale = len(rows_np) / sub
        t_py = tuple(x * scale for x in best_of(lambda: count_python(rows_lists, vocab), 1)[:2])
        stage_counts = torch.load(freq, weights_only=True).numpy()
        same = all(np.array_equal(c, stage_counts) for c in (t_count_file[2], t_count_text[2], t_count_np[2]))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    print(
        f"tiny target (vocab {vocab}) built in {t_build:.1f}s; raw_responses.jsonl "
        f"{raw_mb:.1f} MB, {rows:,} rows; {meta['tokens_total']:,} tokens, "
        f"{meta['tokens_loss_masked']:,} loss-masked; tokenized_data.jsonl {tok_mb:.1f} MB; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; best of {args.repeat} "
        f"(the stage: 1 run)"
    )
    print(f"{'step':<70} {'wall s':>7} {'CPU s':>7} {'MB/s (CPU)':>11}")
    lines = [
        ("raw_responses.jsonl: read + json.loads per line", t_parse_raw, raw_mb),
        ("raw_responses.jsonl: tokenize_stage (whole stage)", t_tok, raw_mb),
        ("tokenized_data.jsonl: read + json.loads per line", t_parse_tok, tok_mb),
        ("tokenized_data.jsonl: read + json.loads + count (numpy mask+bincount)", t_count_file, tok_mb),
        ("tokenized_data.jsonl: read + count, numpy parses the id text (no json)", t_count_text, tok_mb),
        ("counting alone on parsed rows: numpy, 256-row chunks (as the stage)", t_count_np, tok_mb),
        ("counting alone on parsed rows: pure-Python loop (est. from 10%)", t_py, tok_mb),
    ]
    for name, t, mb in lines:
        print(f"{name:<70} {t[0]:>7.2f} {t[1]:>7.2f} {mb / t[1]:>11.1f}")
    print(
        f"tokenize_stage vs bare parse of its input: {t_tok[1] / t_parse_raw[1]:.0f}x the "
        f"CPU time ({t_tok[0] / t_parse_raw[0]:.0f}x the wall time)"
    )
    ratio, ratio_text = t_parse_tok[1] / t_count_file[1], t_parse_tok[1] / t_count_text[1]
    print(
        f"token counting runs at {ratio:.2f}x the speed of merely parsing the file with json "
        f"({ratio_text:.2f}x when numpy parses the ids) (CPU time; goal >= 0.50: "
        f"{'met' if ratio >= 0.5 else 'MISSED'}); counting alone costs "
        f"{t_count_np[1] / t_parse_tok[1]:.1%} of the parse in numpy, "
        f"{t_py[1] / t_parse_tok[1]:.0%} as a Python loop"
    )
    print(f"counts identical to the stage's token_freq.pt: {same}")
    base = scaling[0]
    for procs, wall, digests in scaling:
        print(
            f"tokenize_stage with {procs} process(es): {wall:7.2f} s wall, {raw_mb / wall:6.2f} MB/s of "
            f"raw_responses.jsonl, {base[1] / wall:.2f}x the {base[0]}-process speed; outputs "
            f"byte-identical to {base[0]} process(es): {digests == base[2]}"
        )


if __name__ == "__main__":
    main()
