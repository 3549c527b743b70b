//! Loom models of runcache live in `tests/`; run them with `--cfg runcache_loom`.
