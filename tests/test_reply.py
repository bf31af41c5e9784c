"""A server's reply read as data (rag/serving/reply.py): a string no file can hold is refused where it
stands, as a number JSON does not have is (tests/test_endpoint.py), for every role."""
from __future__ import annotations

import pytest

from rag.serving.reply import BadReply, decode_reply
from tests.scripted_endpoint import ScriptedEndpoint

# JSON may escape half of a UTF-16 pair ("\ud800"); Python reads it into a str that UTF-8 cannot
# encode, so a cache checksum, a result file or a print would fail on it much later.
LONE = {
    '{"choices": [{"message": {"content": "a \\ud800 b"}}]}': "\\ud800) at choices[0].message.content",
    '{"model": "\\udfff"}': "\\udfff) at model",
    '["ok", ["\\udc80"]]': "\\udc80) at [1][0]",
    '"\\ud83d"': "\\ud83d) at the top",
    '{"data": {"\\ud800key": 1}}': "\\ud800) at a key of data",
    '{"\\udbff": 1}': "\\udbff) at a key",
    '{"a": "\\ude00\\ud83d"}': "\\ude00) at a",  # a pair in the wrong order is two lone halves
}


@pytest.mark.parametrize("text", LONE, ids=list(LONE.values()))
def test_a_lone_surrogate_is_refused_where_it_stands(text):
    with pytest.raises(BadReply) as e:
        decode_reply(text)
    assert str(e.value) == f"a lone surrogate ({LONE[text]}, not text"


def test_an_escaped_pair_is_the_character_it_stands_for():
    assert decode_reply('{"a": "\\ud83d\\ude00 and \\u00e9", "b": "\\\\ud800"}') == {"a": "\U0001f600 and é",
                                                                                     "b": "\\ud800"}


def test_a_lone_surrogate_in_an_embeddings_reply_is_one_line():
    from rag.embedder.openai import OpenAIEmbedder
    from rag.endpoint import EndpointError, EndpointSettings

    body = '{"model": "e\\udc00", "data": [{"index": 0, "embedding": [0.1, 0.2]}]}'
    with ScriptedEndpoint(embed=lambda r, n: (200, {}, body)) as srv:
        emb = OpenAIEmbedder(srv.base_url, "e", show_progress=False, endpoint=EndpointSettings(backoff_s=0.01))
        with pytest.raises(EndpointError) as e:
            emb.encode(["a"])
    assert str(e.value) == (f"embedder: POST {srv.base_url}/embeddings answered wrongly: a lone surrogate (\\udc00) "
                            "at model, not text (embedder.model=e); nothing of this reply is kept")
