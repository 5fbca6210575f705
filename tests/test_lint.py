"""cachectl lint: every rule on good and bad fixtures, the sandbox, config, and the output formats."""

from __future__ import annotations

import json

import pytest

from .conftest import FIXTURES, TOK_DIR

LINT = FIXTURES / "lint"


def findings(cli, *paths, extra=()):
    r = cli("lint", *paths, *extra, "-f", "json")
    assert r.exit_code in (0, 1), r.stderr
    return r, [(f["rule"], f["line"]) for f in json.loads(r.stdout)["findings"]]


@pytest.mark.parametrize("name", sorted(p.name for p in (LINT / "good").iterdir()))
def test_good_fixtures_are_clean(cli, name):
    r, found = findings(cli, LINT / "good" / name, extra=("--model", "claude-sonnet-4-5"))
    assert found == [] and r.exit_code == 0


@pytest.mark.parametrize("name, expected", [
    ("time_at_top.j2", {"CC001"}),
    ("user_name_first.j2", {"CC001"}),
    ("clock_call.j2", {"CC001", "CC003"}),
    ("tools_tojson.j2", {"CC006"}),
    # their early breakpoints also close prefixes below claude-sonnet-4-5's 1,024 tokens (body.model): CC005
    ("body_volatile_before_breakpoint.json", {"CC002", "CC005"}),
    ("body_breakpoint_on_volatile.json", {"CC008", "CC005"}),
    ("body_too_many.json", {"CC004", "CC005"}),
    ("chat_template_think.jinja", {"CC007"}),
])
def test_bad_fixtures_are_caught(cli, name, expected):
    r, found = findings(cli, LINT / "bad" / name)
    assert r.exit_code == 1
    assert {rule for rule, _ in found} == expected


def test_breakpoint_below_minimum_from_model_option_or_body(cli, write):
    _, from_body = findings(cli, LINT / "bad" / "body_short.json")  # body.model is claude-sonnet-4-5
    assert from_body == [("CC005", 8)]
    _, found = findings(cli, LINT / "bad" / "body_short.json", extra=("--model", "claude-sonnet-4-5"))
    assert found == [("CC005", 8)]
    body = json.loads((LINT / "bad" / "body_short.json").read_text())
    del body["model"]
    no_model = write("nomodel.json", json.dumps(body, indent=2))
    assert findings(cli, no_model)[1] == []
    # the option wins over the body: Opus 5.5's minimum is 512 tokens, still above this short prefix
    assert findings(cli, no_model, extra=("--model", "claude-opus-5-5"))[1] == [("CC005", 7)]  # one line up


def test_fixture_tokenizer_chat_template(cli):
    """The project's own pitfall template: a date line, tools through tojson, think stripping."""
    _, found = findings(cli, TOK_DIR / "tokenizer_config.json")
    assert {"CC003", "CC006", "CC007"} <= {rule for rule, _ in found}


def test_good_template_is_really_stable():
    """The dynamic check's claim, checked directly: two renders share everything up to the volatile tail."""
    from cachectl.engines.lint.templates import _sample_values, sandbox
    from cachectl.engines.tokendiff import common_prefix_length

    from .conftest import PROMPTS  # noqa: F401

    source = (LINT / "good" / "support_prompt.j2").read_text()
    template = sandbox().from_string(source)
    names = ["user_name", "current_time"]
    a = template.render(**_sample_values(names, 0, {}))
    b = template.render(**_sample_values(names, 1, {}))
    assert a != b
    assert common_prefix_length(a, b) > 0.9 * len(a)
    assert a[:common_prefix_length(a, b)].rstrip().endswith("Customer:")


def test_volatile_late_is_fine_but_early_is_not_with_a_real_tokenizer(cli):
    _, late = findings(cli, LINT / "good" / "support_prompt.j2", extra=("--tokenizer", TOK_DIR))
    _, early = findings(cli, LINT / "bad" / "time_at_top.j2", extra=("--tokenizer", TOK_DIR))
    assert late == [] and early == [("CC001", 1)]


def test_inline_ignore_and_select_ignore(cli):
    _, found = findings(cli, LINT / "good" / "user_name_ignored.j2")
    assert found == []
    _, found = findings(cli, LINT / "bad" / "clock_call.j2", extra=("--ignore", "CC001"))
    assert {r for r, _ in found} == {"CC003"}
    _, found = findings(cli, LINT / "bad" / "clock_call.j2", extra=("--select", "CC001"))
    assert {r for r, _ in found} == {"CC001"}


def test_pyproject_config(cli, tmp_path):
    cfg = tmp_path / "pyproject.toml"
    cfg.write_text('[tool.cachectl.lint]\nignore = ["CC006"]\n[tool.cachectl.lint.per-file-ignores]\n'
                   '"time_at_top.j2" = ["CC001"]\n')
    _, found = findings(cli, LINT / "bad" / "tools_tojson.j2", LINT / "bad" / "time_at_top.j2",
                        extra=("--config", cfg))
    assert found == []
    bad = tmp_path / "bad.toml"
    bad.write_text('[tool.cachectl.lint]\nselect = ["CC999"]\n')
    r = cli("lint", LINT / "good", "--config", bad)
    assert r.exit_code == 2 and "unknown rule id 'CC999'" in r.stderr


def test_exit_zero(cli):
    r = cli("lint", LINT / "bad" / "time_at_top.j2", "--exit-zero")
    assert r.exit_code == 0 and "CC001" in r.stdout


@pytest.mark.parametrize("name, message", [
    ("escape.j2", "escape.j2:1: refused: access to '__class__'"),
    ("syntax.j2", "syntax.j2:2: invalid Jinja"),
    ("raises.j2", "raises.j2:2: template raised while rendering"),
])
def test_bad_templates_exit_2_with_location(cli, name, message):
    r = cli("lint", LINT / "bad" / name)
    assert r.exit_code == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1


def test_bad_json_body(cli, write):
    path = write("body.json", '{"messages": [\n  {"role": "user",, "content": "x"}]}')
    r = cli("lint", path)
    assert r.exit_code == 2 and "body.json:2: invalid JSON" in r.stderr


def test_sarif_is_valid_against_the_schema(cli):
    import jsonschema

    schema = json.loads((FIXTURES / "sarif" / "sarif-2.1.0-rtm.5.json").read_text())
    r = cli("lint", LINT / "bad" / "time_at_top.j2", LINT / "bad" / "body_too_many.json", "-f", "sarif")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    jsonschema.Draft4Validator(schema).validate(doc)
    run = doc["runs"][0]
    ids = [rule["id"] for rule in run["tool"]["driver"]["rules"]]
    assert "CC001" in ids and all(res["ruleId"] == ids[res["ruleIndex"]] for res in run["results"])
    assert {res["ruleId"] for res in run["results"]} == {"CC001", "CC004", "CC005"}


def test_github_workflow_commands(cli):
    r = cli("lint", LINT / "bad" / "time_at_top.j2", "-f", "github")
    line = r.stdout.strip()
    assert line.startswith("::error file=") and ",line=1,col=18,title=CC001::" in line


def test_directory_walk_and_text_output(cli):
    r = cli("lint", LINT / "good")
    assert r.exit_code == 0 and "clean" in r.stdout
    r = cli("lint", LINT / "bad" / "tools_tojson.j2", LINT / "bad" / "time_at_top.j2")
    assert r.exit_code == 1 and "2 finding(s)" in r.stdout and "fix:" in r.stdout


def test_pre_commit_hook_is_declared():
    import yaml

    from .conftest import ROOT

    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert hooks[0]["id"] == "cachectl-lint" and hooks[0]["entry"] == "cachectl lint"


def test_templated_request_bodies(cli):
    _, bad = findings(cli, LINT / "bad" / "request_body.json.j2")
    assert bad == [("CC002", 5)]
    _, good = findings(cli, LINT / "good" / "request_body.json.j2")
    assert good == []


def test_chat_template_stability_in_token_space(cli):
    r, bad = findings(cli, LINT / "bad" / "chat_template_think.jinja", extra=("--tokenizer", TOK_DIR))
    assert [rule for rule, _ in bad] == ["CC007"]
    assert "think_stripped" in json.loads(r.stdout)["findings"][0]["message"]
    _, good = findings(cli, LINT / "good" / "chat_template.jinja", extra=("--tokenizer", TOK_DIR))
    assert good == []


def test_each_finding_says_its_fix_and_whether_it_is_safe(cli):
    r = cli("lint", LINT / "bad" / "tools_tojson.j2", LINT / "bad" / "time_at_top.j2", "-f", "json")
    doc = json.loads(r.stdout)
    assert doc["errors"] == []
    safety = {f["rule"]: f["fix_safety"] for f in doc["findings"]}
    assert safety == {"CC006": "safe", "CC001": "unsafe"}
    assert all(f["fix"] for f in doc["findings"])
    text = cli("lint", LINT / "bad" / "tools_tojson.j2")
    assert "(safe fix: cachectl lint --fix)" in text.stdout


def test_a_safe_fix_lint_cannot_apply_names_the_command_that_does(cli):
    """A body's safe fix is cachectl fix's (over a request log): lint says so in the finding and in --diff/--fix,
    rather than calling it a safe fix and then reporting 0 fixable findings."""
    body = LINT / "bad" / "body_volatile_before_breakpoint.json"
    text = cli("lint", body)
    assert "(safe fix)" not in text.stdout
    assert text.stdout.count("(safe fix: cachectl fix applies it to a request log)") == 2  # CC002, CC005
    doc = json.loads(cli("lint", body, "-f", "json").stdout)
    assert {f["fix_applied_by"] for f in doc["findings"]} == {"cachectl fix"}
    # a templated body's breakpoint: no command moves it
    templated = cli("lint", LINT / "bad" / "request_body.json.j2")
    assert "(safe fix, by hand)" in templated.stdout
    for flag in ("--diff", "--fix"):
        r = cli("lint", flag, body)
        assert "0 fixable finding(s)" not in r.stderr or "cachectl fix applies the safe fixes of request bodies" \
            in r.stderr
        assert "1 JSON or YAML file not edited" in r.stderr and "cachectl fix" in r.stderr


def test_exit_zero_does_not_hide_errors(cli, write):
    bad = write("bad.j2", "{{ x }")
    r = cli("lint", bad, LINT / "bad" / "time_at_top.j2", "--exit-zero")
    assert r.exit_code == 2 and "CC001" in r.stdout and "bad.j2:1: invalid Jinja" in r.stderr


def test_template_bombs_are_refused_not_rendered(cli, write):
    """'%s' * 10**9 would build a 2 GB string while lint renders it: the sandbox refuses the repetition."""
    bomb = write("bomb.j2", "Hello {{ '%s' * 10**9 }} world\n")
    ok = write("ok.j2", "{{ 'ab' * 3 }} {{ 2 ** 10 }}\n")
    r = cli("lint", bomb, ok, "-f", "json")
    assert r.exit_code == 2
    assert "bomb.j2:1: refused: a repetition of 2 x 1,000,000,000 items is refused by the sandbox" in r.stderr
    assert "internal error" not in r.stderr
    assert json.loads(r.stdout)["files"] >= 1  # the other file is still checked


def test_unknown_model_points_at_the_price_table_not_a_flag_lint_lacks(cli):
    r = cli("lint", LINT / "good" / "body_good.json", "--model", "claude-sonet-4-5")
    assert r.exit_code == 2 and "close names: claude-sonnet-4-5" in r.stderr
    assert "--prices" not in r.stderr and "cachectl prompt-cost --list-models" in r.stderr


def test_nothing_checked_is_not_called_clean(cli, tmp_path):
    r = cli("lint", tmp_path / "nope")
    assert r.exit_code == 2 and "clean" not in r.stdout and "0 file(s) checked: no findings" in r.stdout
    good = cli("lint", "fixtures/lint/good")
    assert good.exit_code == 0 and good.stdout.rstrip().endswith("checked: clean")


@pytest.mark.parametrize("brk", ["\x85", "\u2028", "\u2029", "\x0c"])
def test_a_line_break_only_python_sees_moves_no_finding(cli, tmp_path, brk):
    """Jinja numbers lines at \\r\\n, \\r and \\n only; ``str.splitlines`` also breaks at U+0085, U+2028, U+2029 and
    form feeds. A finding's column, and the ignore comments' lines, come from Jinja's lines."""
    p = tmp_path / "t.j2"
    p.write_text(f"{{# a note {brk} here #}}\nYou are a helpful assistant.\nToday is {{{{ now() }}}}.\n",
                 encoding="utf-8")
    r = cli("lint", str(p), "-f", "json")
    got = [(f["rule"], f["line"], f["column"]) for f in json.loads(r.stdout)["findings"]]
    assert ("CC003", 3, 13) in got, got
    p.write_text(f"{{# two {brk}{brk} #}}\n{{# cachectl: ignore[CC003] #}}\nToday is {{{{ now() }}}}.\n",
                 encoding="utf-8")  # (split by splitlines, the comment would cover lines 4 and 5)
    r = cli("lint", str(p), "-f", "json")
    assert "CC003" not in {f["rule"] for f in json.loads(r.stdout)["findings"]}


def test_a_template_sidecar_declares_volatile_and_stable_names_and_their_samples(cli, write):
    """``NAME.samples.json``: ``volatile`` names a variable lint's name patterns miss, ``stable`` one they would
    flag, ``samples`` the two values lint renders with (equal values: no change to find)."""
    tpl = write("p.j2", "Hello {{ product }} from {{ customer }}. " + "stable words here " * 60 + "\n")
    assert findings(cli, tpl)[1] == [("CC001", 1)]  # customer, by its name
    write("p.j2.samples.json", {"stable": ["customer"]})
    assert findings(cli, tpl)[1] == []
    write("p.j2.samples.json", {"stable": ["customer"], "volatile": ["product"]})
    assert findings(cli, tpl)[1] == [("CC001", 1)]
    write("p.j2.samples.json", {"stable": ["customer"], "volatile": ["product"],
                                "samples": [{"product": "cachectl"}, {"product": "cachectl"}]})
    assert findings(cli, tpl)[1] == []


@pytest.mark.parametrize("sidecar, field", [
    ({"samples": [5, 6]}, "samples"), ({"samples": [{"product": "a"}]}, "samples"),
    # a string was read as its letters, a list inside the list stopped lint with an internal error
    ({"volatile": "product"}, "volatile"), ({"volatile": [[1]]}, "volatile"), ({"stable": 3}, "stable"),
])
def test_a_bad_sidecar_is_one_line_naming_its_field(cli, write, sidecar, field):
    tpl = write("p.j2", "Hello {{ product }}. " + "stable words here " * 60 + "\n")
    write("p.j2.samples.json", sidecar)
    r = cli("lint", tpl)
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines()[-1].startswith(f"cachectl: error: {tpl}.samples.json: field '{field}': ")
    assert "internal error" not in r.stderr


def test_a_file_name_with_a_line_break_prints_on_one_line(cli, tmp_path):
    """GitHub Actions reads a workflow command from any line of a job's output: a template named
    "a\\n::warning file=evil.py::injected\\n.j2" printed that line in lint's text output. The name is escaped."""
    bad = (LINT / "bad" / "time_at_top.j2").read_text()
    (tmp_path / "a\n::warning file=evil.py::injected\n.j2").write_text(bad)
    r = cli("lint", tmp_path)
    assert r.exit_code == 1
    assert not any(line.startswith("::") for line in r.stdout.splitlines()), r.stdout
    assert "a\\n::warning file=evil.py::injected\\n.j2" in r.stdout


def test_every_named_chat_template_of_a_tokenizer_config_is_linted(cli, write):
    """A tokenizer_config.json may list named templates ("default", "tool_use", ...). Only the default one was
    linted, and a list without one linted an empty template: "clean", with nothing checked."""
    clock = ("{{ bos_token }}Today is {{ strftime_now('%d %B %Y') }}.\\n{% for m in messages %}"
             "{{ m['role'] }}: {{ m['content'] }}\\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    plain = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\\n{% endfor %}"
             "{% if add_generation_prompt %}assistant:{% endif %}")
    path = write("tokenizer_config.json", {"chat_template": [{"name": "default", "template": plain},
                                                             {"name": "tool_use", "template": clock}]})
    r, found = findings(cli, path)
    assert {rule for rule, _ in found} == {"CC003"}
    assert "(chat_template 'tool_use' line 1)" in r.stdout
    write("tokenizer_config.json", {"chat_template": [{"name": "tool_use", "template": "{% if %}"}]})
    bad = cli("lint", path)
    assert bad.exit_code == 2 and "invalid Jinja" in bad.stderr and "(chat_template 'tool_use' line 1)" in bad.stderr
    write("tokenizer_config.json", {"chat_template": [{"name": "default"}]})
    bad = cli("lint", path)
    assert bad.exit_code == 2 and "field 'chat_template[0]': expected a named template" in bad.stderr


def test_a_select_that_names_no_rule_is_refused(cli):
    r = cli("lint", "--select", ",,", LINT / "bad" / "time_at_top.j2")
    assert r.exit_code == 2 and "--select names no rule" in r.stderr


def test_a_yaml_bodys_findings_and_errors_name_their_lines(cli, write):
    """A YAML body was located with the JSON scanner, which finds no path in YAML: every finding and error named
    line 1, and two findings at the one place were one. A key named twice was read as its last value."""
    body = ("model: claude-sonnet-4-5\nmessages:\n  - role: user\n    content:\n      - type: text\n        text: hi\n"
            "        cache_control: {type: ephemeral, ttl: 1h}\n      - type: text\n        text: yo\n"
            "        cache_control: {type: ephemeral, ttl: 5m}\n")
    path = write("body.yaml", body)
    _, found = findings(cli, path)
    assert found == [("CC005", 7), ("CC005", 10)]
    write("body.yaml", "model: claude-sonnet-4-5\nmessages:\n  - role: user\n    content: hi\n"
                       "  - role: assistant\n    content: [{type: text, text: 12:30:00}]\n")
    r = cli("lint", path)
    assert r.exit_code == 2 and f"{path}:6: field 'messages[1].content[0].text'" in r.stderr
    write("body.yaml", "model: claude-sonnet-4-5\nmessages:\n  - role: user\n    content: hi\nmessages: []\n")
    r = cli("lint", path)
    assert r.exit_code == 2 and f"{path}:5: duplicate key 'messages'" in r.stderr


def test_a_file_named_twice_is_linted_and_fixed_once(cli, tmp_path):
    """`lint --fix f f dir/` said "fixed 4 finding(s) in 4 file(s)" of one file; lint counted it three times."""
    tpl = tmp_path / "t.j2"
    tpl.write_text((LINT / "bad" / "tools_tojson.j2").read_text())
    r = cli("lint", tpl, tpl, tmp_path, "-f", "json")
    assert json.loads(r.stdout)["files"] == 1 and len(json.loads(r.stdout)["findings"]) == 1
    r = cli("lint", "--fix", tpl, tpl, tmp_path)
    assert "in 1 file(s)" in r.stdout + r.stderr, r.stdout + r.stderr


BIG = "9" * 5000  # past Python's 4,300 digits: json, YAML and TOML raised ValueError, an internal error


@pytest.mark.parametrize("name, text, says", [
    ("big.json", '{"model": "x", "max_tokens": ' + BIG + ',\n "messages": [{"role": "user", "content": "hi"}]}',
     "big.json:1: invalid JSON: an integer of 5,000 digits"),
    ("big.yaml", f"model: x\nmax_tokens: {BIG}\nmessages: [{{role: user, content: hi}}]\n",
     "big.yaml:2: invalid YAML: an integer of 5,000 digits"),
])
def test_an_integer_of_more_digits_than_python_reads_is_one_located_line(cli, tmp_path, name, text, says):
    (tmp_path / name).write_text(text)
    good = tmp_path / "good.json"
    good.write_text('{"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}')
    r = cli("lint", good, tmp_path / name)
    assert r.exit_code == 2 and "internal error" not in r.stderr
    assert r.stderr.strip().splitlines() == [f"cachectl: error: {tmp_path}/{says} (at most 4,300: no token count, "
                                             "price or setting has as many)"]
    assert "1 file(s) checked" in r.stdout  # and the good file is still checked
    (tmp_path / "pyproject.toml").write_text(f"[tool.cachectl.lint]\ntail-tokens = {BIG}\n")
    r = cli("lint", good, "--config", tmp_path / "pyproject.toml")
    assert r.exit_code == 2 and r.stderr.startswith(f"cachectl: error: {tmp_path / 'pyproject.toml'}:2: invalid TOML: "
                                                    "an integer of 5,000 digits"), r.stderr


def test_a_cassette_or_tool_arguments_with_such_an_integer(cli, tmp_path):
    cassette = (FIXTURES / "logs" / "vcr_anthropic_cache.yaml").read_text(encoding="utf-8")
    (tmp_path / "c.yaml").write_text(cassette.replace("max_tokens: 4096", f"max_tokens: {BIG}", 1))
    r = cli("prompt-cost", tmp_path / "c.yaml")
    line = cassette[:cassette.index("max_tokens: 4096")].count("\n") + 1
    assert r.exit_code == 2 and r.stderr.startswith(f"cachectl: error: {tmp_path / 'c.yaml'}:{line}: invalid YAML "
                                                    "cassette: an integer of 5,000 digits"), r.stderr
    # tool-call arguments are a JSON string the chat template gets parsed: past the digits, it gets the string
    body = {"model": "gpt-4.1", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": ' + BIG + '}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}
    (tmp_path / "args.json").write_text(json.dumps(body))
    r = cli("prompt-cost", tmp_path / "args.json", "-t", TOK_DIR)
    assert r.exit_code == 0, r.stderr


def test_sarif_uris_are_percent_encoded_uri_references(cli, tmp_path):
    """The raw path was written as the URI: no URI for a name with a space, and another file's for one with '%',
    '#', '?' or a ':' before its first '/' (a scheme). GitHub code scanning and other SARIF readers resolve it."""
    from urllib.parse import unquote, urlsplit

    names = ["a b.j2", "c:d.j2", "a%20b.j2", "q#x.j2", "r?s.j2"]
    for n in names:
        (tmp_path / n).write_text("{% for tool in tools %}{{ tool | tojson }}{% endfor %}\n")
    r = cli("lint", tmp_path, "-f", "sarif")
    assert r.exit_code == 1, r.stderr
    uris = [res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
            for res in json.loads(r.stdout)["runs"][0]["results"]]
    assert sorted(unquote(urlsplit(u).path) for u in uris) == sorted(f"{tmp_path}/{n}" for n in names)
    assert all(not urlsplit(u).scheme and not urlsplit(u).query and not urlsplit(u).fragment for u in uris)


def test_an_unknown_config_key_is_named_and_per_file_globs_match_from_the_config(cli, tmp_path, monkeypatch):
    """A misspelled key of [tool.cachectl.lint] was dropped unsaid (`ignores`, `render_timeout`), and a
    per-file-ignores glob matched the path as typed only: `sub/*.j2` held for `lint sub`, not for `lint $PWD/sub`
    nor from inside `sub` with --config ../pyproject.toml."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "t.j2").write_text((LINT / "bad" / "tools_tojson.j2").read_text())
    (tmp_path / "pyproject.toml").write_text('[tool.cachectl.lint]\nignores = ["CC006"]\n')
    r = cli("lint", "sub")
    assert r.exit_code == 2 and r.stderr.strip().splitlines() == [
        "cachectl: error: pyproject.toml: field 'tool.cachectl.lint.ignores': unknown key 'ignores': did you mean "
        "'ignore'? (known: select, ignore, per-file-ignores, model, tail-tokens, render-timeout, render-memory)"]
    (tmp_path / "pyproject.toml").write_text('[tool.cachectl.lint]\nrender_timeout = 3\n')
    assert "did you mean 'render-timeout'?" in cli("lint", "sub").stderr
    (tmp_path / "pyproject.toml").write_text('[tool.cachectl.lint.per-file-ignores]\n"sub/*.j2" = ["CC006"]\n')
    for args in (("sub",), (str(tmp_path / "sub"),), ("./sub/t.j2",)):
        r = cli("lint", *args)
        assert r.exit_code == 0 and "clean" in r.stdout, (args, r.stdout)
    monkeypatch.chdir(tmp_path / "sub")
    r = cli("lint", "--config", "../pyproject.toml", "t.j2")
    assert r.exit_code == 0 and "clean" in r.stdout, r.stdout
    (tmp_path / "pyproject.toml").write_text('[tool.cachectl.lint.per-file-ignores]\n"other/*.j2" = ["CC006"]\n')
    assert cli("lint", "--config", "../pyproject.toml", "t.j2").exit_code == 1   # and a glob elsewhere does not
