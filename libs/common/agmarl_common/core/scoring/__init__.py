"""Pure pair scorers: what placing a pod on each candidate node scores, below both the policies that rank
nodes with them and the features that hand them to the learned model.

Each ``score_*`` is a pure function ``(pod, state, candidates) -> (len(candidates),) float``; nothing here
keeps state, reads a clock or draws a random number. The package imports the cluster model and the reward
only: never the policies, the features or the simulator (``tests/test_architecture.py``).

- ``kube_resources``, ``kube_affinity``: kube-scheduler's default scoring plugins with their real formulas.
  Faithful to kube-scheduler v1.36 (BalancedAllocation scores the change in balance the pod makes, since
  v1.36.0, kubernetes PR #135573); checked plugin by plugin against placements and per-plugin scores
  recorded from a real v1.36 scheduler (``agmarl fidelity kube``, docs/kube-fidelity.md). Scores are 0..100
  (``MAX_NODE_SCORE``), already normalised the way the plugin's NormalizeScore does it over the candidate
  (filtered) nodes; integer arithmetic follows the Go code (int64 truncation, math.Round where Go rounds),
  so a score here equals kube-scheduler's for the same cluster. Sources (kubernetes
  pkg/scheduler/framework/plugins): noderesources/{least_allocated, most_allocated,
  requested_to_capacity_ratio, balanced_allocation, resource_allocation}.go, tainttoleration,
  nodeaffinity, podtopologyspread/scoring.go, interpodaffinity/scoring.go, helper.DefaultNormalizeScore
  and helper.BuildBrokenLinearFunction. Not modelled: ImageLocality (the model has no images; it scores 0
  on every node when nodes report no ``status.images``), DynamicResources scoring (no resource claims), the
  system-default spread constraints (they need the pod's owning Service/ReplicaSet), VolumeBinding scoring.
- ``kube_profile``: the default profile's plugin weights and the framework's weighted sum
  (sum(weight * plugin score)), and the preference plugins' share of it (``score_preferences``).
- ``rewardaware``: the reward-aware score, the one-step change of the composite reward a placement makes
  plus kube-default's preferences; ``policies.rewardaware`` ranks nodes with it and the learned model's
  ``reward_gain`` input (``features.pairs.objective_gains``) is it, rescaled per pod.
"""
