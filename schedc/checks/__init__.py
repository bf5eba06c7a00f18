"""The checks, one module each: structure (every op once, on its stage's device), deadlock (program
order plus dependencies acyclic), memory (peaks within the limit) and, on the lowered plan, channels
(messages match and a blocking run completes). A check returns diagnostics and never rewrites."""
