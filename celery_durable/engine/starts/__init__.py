"""How an execution starts: with a dedup key, one running execution per key (``dedup``); with a
deadline or a delay, its clocks (``deadlines``); debounced, later keyed starts moving a scheduled
one (``debounce``)."""
