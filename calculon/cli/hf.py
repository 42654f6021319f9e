"""``calculon import-hf``: a Hugging Face config.json -> an application."""

import os

from calculon import outputs
from calculon.cli.main import EXIT_OK, positive_int
from calculon.errors import ConfigError
from calculon.units import human_format


def add_parsers(sp):
  p = sp.add_parser(
    'import-hf', help='turn a Hugging Face config.json into an application',
    description='Read a Hugging Face transformers config.json (Llama, '
    'Mistral, Mixtral, Qwen2/Qwen2-MoE/Qwen3/Qwen3-MoE, Gemma/Gemma2, '
    'GPT-NeoX, GPT-2, Falcon, DeepSeek-V2/V3) and write the application '
    'JSON. What the application cannot express is an error (exit 2) or, '
    'when its omission is small, a note in the output\'s "notes".')
  p.add_argument('config', help='config.json of the model')
  p.add_argument('output', help='application to write (*.json or '
                 '*.json.gz)')
  p.add_argument('--seq', type=positive_int, default=None, metavar='N',
                 help='sequence length (default: max_position_embeddings)')
  p.add_argument('--name', default=None,
                 help='the application\'s name (default: _name_or_path or '
                 'the config\'s folder)')
  p.set_defaults(func=run_import)


def check_output(path, inputs=()):
  """Checks before any work that ``path`` can be written as a JSON file
  (:func:`calculon.outputs.check_output_path`) and is not an input.

  Raises:
    ConfigError: not *.json/*.json.gz, a directory, its folder missing or
      not writable, or the same file as one of ``inputs``.
  """
  outputs.check_output_path(path, outputs.JSON_KINDS)
  for other in inputs:
    if os.path.exists(path) and os.path.exists(other) and \
        os.path.samefile(path, other):
      raise ConfigError(f'{path}: output would overwrite the input {other}',
                        source=path)


def run_import(args, log):
  from calculon.config import Application
  from calculon.hf import application_from_hf
  check_output(args.output, [args.config])
  from calculon import io  # here: numpy, not needed by other commands
  cfg = io.read_json_file(args.config)
  app, notes = application_from_hf(cfg, args.config, seq=args.seq,
                                   name=args.name)
  model = Application.from_dict(app, args.config)
  io.write_json_file(app, args.output)
  total, active = model.num_parameters(), model.num_active_parameters()
  count = human_format(total)
  if active != total:
    count += f' ({human_format(active)} active)'
  log.info(f'{args.config} -> {args.output}: {app["name"]}, {count} '
           'parameters')
  for note in notes:
    log.info(f'  note: {note}')
  return EXIT_OK
