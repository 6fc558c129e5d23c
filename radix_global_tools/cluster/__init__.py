"""``radix-global cluster`` (:mod:`.main`): SGLang engines and routers on this machine
(:mod:`.local`), or over test hosts made of network namespaces (:mod:`.hosts`, :mod:`.netns`,
:mod:`.host_cluster`); process groups and bounded waits (:mod:`.procs`)."""
