"""What every layer of lipt stands on, importing nothing else of lipt: the run's typed settings
(`settings`, `schema`, `selector`), one-line user errors (`errors`), seeds (`seeding`), atomic
files (`artifacts`), the run folder's lock and this process's job (`lock`, `job`), the machine
(`host`), the console's lines (`console`) and the one scan for NaN and infinite values
(`finite`)."""
