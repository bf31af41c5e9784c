"""Question sets generated for a corpus that has none (`python -m rag.testset`, see
docs/how-to/testset.md): passages drawn across sources and documents, questions and answers
written by an LLM or by structural templates, filtered by readable checks, and written as a
`qa=jsonl` file with each question's provenance."""
