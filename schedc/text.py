"""Numbers in words, each rule once: plurals and verb agreement, ordinals, a list cut to its first items
"... and N more" with one cap, and byte units. Every message of the compiler, the search and the
command line writes them through here."""
from __future__ import annotations

MAX_SHOWN = 20  # items (or diagnostics of one kind) shown one by one; the rest are counted
GIB = 2**30     # bytes in a GiB, the unit memory is shown in


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """`1 device`, `2 devices`, `1,024 devices` (`nouns`: the plural where it is not noun + s)."""
    return f"{n:,} {noun if n == 1 else nouns or noun + 's'}"


def agree(n: int, one: str, many: str) -> str:
    """The word that agrees with a count: agree(1, "needs", "need") is "needs", agree(2, ...) "need"."""
    return one if n == 1 else many


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st, 1,001st."""
    suffix = "th" if 10 <= n % 100 < 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n:,}{suffix}"


def more(count: int, what: str = "") -> str:
    """What a cut list says of the rest: `... and 1,234 more` (`what`: `more devices`)."""
    return f"... and {count:,} more" + (f" {what}" if what else "")


def listed(items: list[str], sep: str = ", ", limit: int = MAX_SHOWN) -> str:
    """Items joined by sep, at most `limit` of them, then `... and N more` (a line per device of 1,000
    devices is not read)."""
    shown = sep.join(items[:limit])
    return shown + (" " + more(len(items) - limit) if len(items) > limit else "")


def rate(value: float) -> str:
    """A rate such as TFLOP/s per GPU: one decimal from 1 up, three significant digits below (a CPU's
    0.0123, not 0.0)."""
    return f"{value:.1f}" if abs(value) >= 1 else f"{value:.3g}"


def gib(nbytes: float, digits: int = 2) -> str:
    """Bytes in GiB with `digits` decimals, no unit: gib(3 * 2**30) is "3.00"."""
    return f"{nbytes / GIB:.{digits}f}"


def memory_more(parts: dict[str, float], unit: str = "") -> str:
    """The memory parts beyond the backward's peak tensors, in words (GiB)."""
    return (f"optimizer step beyond the activations {gib(parts['optimizer_step'])}{unit}, "
            f"allocator and CUDA context {gib(parts['allocator_and_context'])}{unit}")
