"""Per-component parity runners. Each module exposes `run_case(case_dir, manifest, parity_root)`."""
