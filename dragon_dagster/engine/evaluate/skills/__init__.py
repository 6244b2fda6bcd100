"""The bundled general-skills suite: lm-evaluation-harness task files (skills_*.yaml) on data made by
make_data.py, read from disk by rows.py (no hub). The runner is evaluate/general_skills.py."""
