"""The Hugging Face export, in one place: DeepSpeed checkpoint -> HF directory (export.py), HF -> warm start
(warm_start.py), the name maps of stock BERT / ModernBERT (stock_bert.py, stock_modernbert.py), our model code for
trust_remote_code (remote_code.py, remote_template/), the model card and the SentencePiece tokenizer.
``python -m tools.convert_checkpoint`` is its command line."""
