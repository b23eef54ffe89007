"""The FGD placement study: the arrival-inflation experiment (``inflation``), every (policy, seed) run of it
(``sweep``), its inputs (``inputs``), placement speed (``benchmark``) and the authors' published results
(``published``).
"""
