"""Deciding a grid in looks: the maths (alpha spending and its boundaries, the decision at a look, the next
action and its price), borrowed seed variances, the bounded spend, the decision pass the launcher calls on
each housekeeping pass, and the looks as the read side shows them.

`spending.py` and `sequential.py` are pure; `borrowed.py` (pure) and `borrowing.py` (the earlier grids'
runs) give borrowed variances; `unpaired.py` (pure) reads a comparison's seeds unpaired where the grid's
seeds share no effect; `budget.py` bounds the spend; `plan_look.py` (pure) is the look: each
comparison's decision and the work to queue; `decider.py` gathers a look's state, calls it and queues its
work; `decisions.py` reads the looks back for the report, the dashboard and `ablate status`.
"""
