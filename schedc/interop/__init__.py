"""Other tools' formats: torch.distributed.pipelining's CSV schedules (torch_csv) and measured cost
profiles (profiles: schedc's costs JSON and PipeFisher's profile CSVs)."""
