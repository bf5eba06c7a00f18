"""The library of model descriptions (schedc/models/*.toml: the GPT rows of Megatron-LM's Table 1 and the
zero bubble paper), shipped as package data and found by name (`--model gpt-175b`), as clusters are."""
