"""``calculon frameworks [NAME ...] [--json]``: the framework presets, what
each sets, allows and requires."""

from calculon.cli.main import EXIT_OK


def add_parsers(sp):
  p = sp.add_parser(
    'frameworks', help='list the framework presets (what each sets and '
    'allows)',
    description='List the framework presets of frameworks/ (name, era, '
    'title), or describe the ones named: the behaviours each sets, the '
    'options it allows (the search space under --framework), its offload '
    'kinds and constraints, each with its source.')
  p.add_argument('names', nargs='*', metavar='NAME',
                 help='presets to describe (default: list them all)')
  p.add_argument('--json', action='store_true',
                 help='print the presets as JSON')
  p.add_argument('--no-sources', action='store_true',
                 help='leave the sources out of the description')
  p.set_defaults(func=run)


def run(args, log):
  from calculon import frameworks
  from calculon.frameworks import describe as D
  names = args.names or frameworks.names()
  presets = [frameworks.load(n, source='calculon frameworks') for n in names]
  if args.json:
    import json
    print(json.dumps([D.as_json(p) for p in presets], indent=2))
    return EXIT_OK
  if not args.names:
    rows = D.summary_rows(presets)
    width = max(len(r[0]) for r in rows)
    log.info(f"{'name':<{width}}  era / title")
    for name, era, title in rows:
      mark = ' (default for modern executions)' \
        if name == frameworks.RECOMMENDED else \
        ' (default for Calculon files)' if name == frameworks.CALCULON \
        else ''
      log.info(f'{name:<{width}}  {era}: {title}{mark}')
    log.info('')
    log.info('calculon frameworks NAME describes one: what it sets, allows '
             'and requires.')
    return EXIT_OK
  for i, preset in enumerate(presets):
    if i:
      log.info('')
    for line in D.describe(preset, sources=not args.no_sources):
      log.info(line)
  return EXIT_OK
