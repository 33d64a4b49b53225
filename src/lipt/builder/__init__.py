"""The builder: a Run's group nodes instantiated into objects, each by its `_target_`
(`objects`). The stages call it; it stands on the data, models and methods below it."""
