#!/usr/bin/env python3
"""Markdown tables from bench/e4b_suite.sh output: bench/suite_table.py results.jsonl"""
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
print("| config | ranks x threads | prefill 512 tok/s | TTFT s | decode tok/s | read BW GB/s | roofline "
      "| buffer BW GB/s (roofline) | batch 8 tok/s (x single) | peak RSS GB per rank | comm ms/token |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    # Since session 34 read BW is measured on the weights' own memory and the separate buffer beside it.
    buffer = (f"{r['buffer_read_bw_gb_s']:.1f} ({r['buffer_roofline']:.2f})" if "buffer_read_bw_gb_s" in r
              else "-")
    rss = " / ".join(f"{g:.2f}" for g in r["peak_rss_gb_per_rank"])
    print(f"| {r['config']} | {r['ranks']} x {r['threads_per_rank']} | {r['prefill_tok_s']:.1f} | {r['ttft_s']:.2f} "
          f"| {r['decode_tok_s']:.2f} | {r['read_bw_gb_s']:.1f} | {r['roofline']:.2f} "
          f"| {buffer} "
          f"| {r['batch_decode_tok_s']:.1f} ({r['batch_decode_tok_s'] / r['decode_tok_s']:.1f}x) | {rss} "
          f"| {1000 * r['comm_s_per_token']:.1f} |")
