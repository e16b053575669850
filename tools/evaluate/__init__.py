"""Downstream evaluation as the papers do it: GLUE, SWAG, SQuAD 1.1/2.0, MRQA and XNLI suites, their protocols as
data, sweeps over grid x seeds that resume, and a paper-shaped table (``python -m tools.evaluate``).

Modules (one home each):
  examples.py   the canonical example types every reader returns and every fine-tuning run consumes
  tasks.py      the task registry (kind, labels, metrics, dev splits, the GLUE average)
  data.py       readers and the file layouts: GLUE TSV, HF datasets (parquet / save_to_disk), SWAG CSV, SQuAD JSON, MRQA jsonl(.gz)
  metrics.py    accuracy, F1, Matthews, Pearson/Spearman, SQuAD v1.1/v2.0 (null threshold, HasAns/NoAns), MRQA
  protocols.py  the papers' settings (grids, epochs, seeds, warmup, max length, stride) as one registry
  sweep.py      grid x seeds, one fine-tuning per point, resumable; median over seeds of the best grid point
  table.py      Markdown + JSON tables, one column per checkpoint
The fine-tuning itself is tools/finetune.py (heads through HF's Auto classes, HF's Trainer).
"""
