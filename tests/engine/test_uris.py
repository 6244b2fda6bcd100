"""A store's password never reaches a message, and hiding it garbles nothing else."""

from dragon_dagster.engine.text.uris import scrub


def test_a_password_is_hidden_wherever_it_stands_alone_and_no_word_loses_its_letters():
    uri = "postgresql://dagster:p@db.internal:5432/dagster"
    said = "connection to postgresql://dagster:p@db.internal:5432/dagster failed: port 5432 refused ('p')"
    assert scrub(said, uri) == (
        "connection to postgresql://dagster:***@db.internal:5432/dagster failed: port 5432 refused ('***')"
    )
    long = "postgresql://u:s3cr%21t@h/db"  # written encoded in the URI, decoded in a driver's words
    assert scrub("auth s3cr!t and s3cr%21t", long) == "auth *** and ***"
