"""Learner side: DeepSpeed learner ranks and the learner group. The weights' way to the samplers lives in
``exgrpo.transport`` (packed buffers, the object store, vLLM's weight-transfer API and its gloo engine).

``learner.Learner`` is one DeepSpeed rank (a plain class; Ray is applied by the caller), ``update`` the ExGRPO
update as plain torch functions over an ``engine.UpdateEngine``, and ``group.LearnerGroup`` the L ranks in one
placement group (``exgrpo.core.roles.Learners``). Each module's role: docs/architecture.md ("Packages and the
import rule").
"""
