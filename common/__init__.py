"""The base layer every package may import: standard-library helpers two or more packages need (strict config
dicts, the dataclass-to-CLI generator). It imports nothing of ours; tests/test_lint.py checks the layering."""
