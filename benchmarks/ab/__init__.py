"""Speed A/B of the hot CPU paths: the working tree against a base commit, side by side (docs/performance.md)."""
