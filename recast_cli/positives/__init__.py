"""Stage 1, first command: π⁺ surrogate images (docs/method.md §4, "Positive samples"; E2).

``recast sample-positive`` writes a ``recast.positives/1`` folder from one source:

* ``renderer`` (:mod:`.renderer`): the toy world's procedural renderer;
* ``folder:DIR`` (:mod:`.folder`): existing images with a manifest or a ``metadata.jsonl``;
* ``diffusers:PATH`` (:mod:`.pipeline`): a local diffusers text-to-image pipeline;
* ``openai`` (:mod:`.openai_images`) and ``gemini`` (:mod:`.gemini_images`): image APIs,
  with the retries and bounded concurrency of :mod:`.api`;
* ``self`` (:mod:`.sir`): sampling-importance-resampling from π^old, one set per reward.

:mod:`.collect` runs any source into the folder (resume, normalisation, manifest);
:mod:`.commands` is the CLI shell.
"""
