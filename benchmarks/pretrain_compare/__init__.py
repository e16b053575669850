"""Pretrain several attention set-ups on the same data, seed, batches and steps, and compare them on held-out text.

Every run goes through the real trainer (``pretrain/train.py`` under the DeepSpeed launcher, ZeRO-2 by default) and
is evaluated by the trainer itself at ``--eval-interval`` on the same held-out batches: the validation set comes from
separate shards of whole held-out documents (``--valid-data-path``), or from the whole-document valid split of the
training shards, and is sampled and masked with one fixed ``--valid-seed`` for every config and training seed. The
script writes ``results.json`` (every run's evaluations, step time, peak memory, training time, tokens, plus a
per-config summary) and PNG plots: validation perplexity vs step, vs training time and vs tokens, and peak memory /
step time per config.

An interrupted comparison resumes: finished runs (``done.json``) are skipped, an unfinished run continues from its
newest checkpoint (the trainer's ``--load``), so a long comparison can be spread over several sittings.

    .venv/bin/python -m benchmarks.pretrain_compare --out /work/compare_runs/cmp --preset cpu-small \\
        --data-path 0.5 books_text_sentence 0.5 wiki_text_sentence \\
        --valid-data-path 0.5 vbooks_text_sentence 0.5 vwiki_text_sentence --vocab-file vocab.txt
    # table + plots from what ran: the same command with --report-only (the flags define the runs); copies of the
    # plots and results.json for the docs with --figures-dir docs/figures (as compare_*.png, compare_results.json)

``--preset bert-base`` is the paper-scale encoder (12 x 768, N=512, bf16, global batch 256) for a GPU node.
"""
