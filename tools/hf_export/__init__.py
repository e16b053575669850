"""Hugging Face export helpers: our model code flattened into a trust_remote_code directory, and the model card."""
