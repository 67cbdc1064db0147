"""`--config` takes a recipe file or a built-in recipe by name (serve/core/recipes.py): the names, their spellings, a
user's file first, and one line with exit 2 for a name or path that is neither."""
from __future__ import annotations

from pathlib import Path

import pytest

from draftsmith.serve.core.errors import ConfigError
from draftsmith.serve.core.recipes import builtin_dir, builtin_recipes, resolve_recipe

ROOT = Path(__file__).resolve().parents[1]


def test_the_builtin_recipes_are_the_yaml_files_of_configs():
    assert builtin_dir().resolve() == (ROOT / "configs").resolve()
    names = builtin_recipes()
    assert {"demo/quick", "demo/full", "smollm2-135m/eagle3", "llama-3.1-8b/eagle3", "debug/tiny"} <= set(names)
    on_disk = {p.relative_to(ROOT / "configs").with_suffix("").as_posix() for p in (ROOT / "configs").rglob("*.yaml")
               if p.relative_to(ROOT / "configs").parts[0] not in ("accelerate", "ablations")}
    assert set(names) == on_disk and names == sorted(names)


@pytest.mark.parametrize("spec", ["smollm2-135m/eagle3", "smollm2-135m/eagle3.yaml", "configs/smollm2-135m/eagle3.yaml",
                                  "configs/smollm2-135m/eagle3"])
def test_a_builtin_recipe_by_name_from_any_folder(spec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_recipe(spec).resolve() == (ROOT / "configs/smollm2-135m/eagle3.yaml").resolve()


def test_a_users_file_comes_before_a_builtin_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "smollm2-135m" / "eagle3.yaml"
    mine.parent.mkdir()
    mine.write_text("optim:\n  lr: 1.0e-4\n")
    assert resolve_recipe("smollm2-135m/eagle3.yaml") == Path("smollm2-135m/eagle3.yaml")
    assert resolve_recipe(str(mine)) == mine


def test_neither_a_file_nor_a_builtin_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"smollm2-135m/nope is neither a file nor a built-in recipe; built-in "
                                          r"recipes: data/default, .*smollm2-135m/eagle3"):
        resolve_recipe("smollm2-135m/nope")
    for path in (str(tmp_path / "missing.yaml"), "../missing.yaml", "recipe.json"):
        with pytest.raises(ConfigError, match=r"config file not found: .* \(no such file") as err:
            resolve_recipe(path)
        assert "demo/quick" not in str(err.value)  # a path of the user's: the names would be noise
    (tmp_path / "recipes").mkdir()
    with pytest.raises(ConfigError, match="a folder, not a recipe file"):
        resolve_recipe("recipes")


def test_the_cli_prints_a_builtin_recipe_and_refuses_a_wrong_name(tmp_path, monkeypatch, capsys):
    from draftsmith.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", "smollm2-135m/eagle3", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "spec: demo" in out and "draft_vocab_size:" in out
    for spec, says in (("smollm2-135m/eagle4", "built-in recipes: "), (str(tmp_path / "r.yaml"), "no such file")):
        with pytest.raises(SystemExit) as exit_:
            main(["train", "--config", spec, "--print-config"])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.startswith("error: config file not found: ") and says in err
        assert err.count("\n") == 1
