"""Report files: of the placement study's sweeps (``placement_study``) and of the timeline replay (``timeline``)."""
