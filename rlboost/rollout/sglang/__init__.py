"""The SGLang rollout engine: the RolloutEngine protocol over SGLang's offline `Engine`
(SGLang 0.5.9 to 0.5.23). config holds SGLangEngineConfig, engine the SGLangEngine; requests
(one sample as SGLang requests), weights (checks, buckets, the update calls) and thread (the
loop that owns SGLang) are the parts it is made of."""
