"""The configuration as composed from conf/ and checked: Hydra's resolvers, the project root and
the one-line form of a configuration error (`compose`), the schema of every value and component
node (`schema`), what every command line shares (`cli`), and the configuration reference's option
table read from conf/ (`reference`). The typed settings a run reads are `rag.run.settings`."""
