"""The library of cluster descriptions (schedc/clusters/*.toml), shipped as package data."""
