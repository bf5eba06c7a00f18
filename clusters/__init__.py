"""The library of cluster descriptions (clusters/*.toml), shipped as package data."""
