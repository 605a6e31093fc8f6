#!/usr/bin/env python3
"""Build fixture B: a second small AlphaFold-Multimer v2.3.2 reference made with DeepMind's JAX
code, with every width distinct (structure-module num_channel 32 beside seq_channel 40, ...),
a heterotrimer with a repeated chain (A2B) and a homodimer with zero templates.

It runs the shared fixture's generator (`af2_reference/multimer/make_fixture_multimer.py`,
imported as a library, not copied) step by step with other sizes and cases:
per-chain monomer features (AlphaFold's hmmsearch + HmmsearchHitFeaturizer templates),
AlphaFold's own `pipeline_multimer.DataPipeline.process` (pairing by species, merge, pad_msa),
re-randomised parameters in AlphaFold's flat npz naming (reloaded by get_model_haiku_params),
`jax.jit(modules_multimer.AlphaFold.apply)` with PRNGKey(0) and the same recorders of the
in-model MSA sampling. Two additions, both only observing values:
- the inputs of `template_pair_embedding_{4,5,6}` (the template backbone unit vectors) are
  recorded in the same run, and their diagonal [T, L, 3] is stored (`template_unit_diagonal_
  <case>` in sampled_msa_<case>.npz): AlphaFold's fused float32 kernels leave rounding noise
  there that a port cannot compute (tests/test_multimer_model.py, `_alphafold_unit_diagonal`);
- to stay small, only the outputs the tests compare are kept, and npz files are compressed.

    PYTHONPATH=<alphafold v2.3.2 source> <venv>/bin/python make_fixture_multimer_b.py \
        --reference <repo>/../shared/af2_reference/multimer --data <shared/data> --out DIR
"""

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import time
import zipfile

CHAIN_A, CHAIN_B = 'hbA_1-36', 'hbB_1-40'
NO_TEMPLATE_CHAIN = '2p90_A02_no_templates'
SMALL_MODEL_NAME = 'model_1_multimer_v3_small_b'
PARAM_RERANDOM_SEED = 1357
NO_TEMPLATE_DATE = '1900-01-01'     # every template hit is released later: zero templates
KEEP_OUTPUTS = ('structure_module/final_atom_positions', 'structure_module/final_atom_mask',
                'representations/single', 'representations/structure_module',
                'confidence/plddt', 'confidence/ptm', 'confidence/iptm',
                'confidence/ranking_confidence', 'num_recycles')
KEEP_SAMPLED = ('index_order', 'extra_msa_mask')
CASES = [
    dict(name='A2B_hbA1-36x2_hbB1-40', chains=[CHAIN_A, CHAIN_A, CHAIN_B],
         note='heterotrimer A2B: two copies of haemoglobin alpha (res 1-36) + beta (res 1-40), '
              'species pairing, templates'),
    dict(name='2p90_A02_x2_no_templates', chains=[NO_TEMPLATE_CHAIN, NO_TEMPLATE_CHAIN],
         note='homodimer of 2p90_A02 with zero templates (max_template_date 1900-01-01)'),
]


def width_overrides(evo, tpl_key):
  """Every width distinct from every other (and from fixture A's)."""
  return {
      f'{evo}.msa_channel': 24, f'{evo}.pair_channel': 20, f'{evo}.extra_msa_channel': 12,
      f'{evo}.seq_channel': 40,
      f'{evo}.evoformer.msa_row_attention_with_pair_bias.num_head': 3,
      f'{evo}.evoformer.msa_column_attention.num_head': 3,
      f'{evo}.evoformer.outer_product_mean.num_outer_channel': 6,
      f'{evo}.evoformer.triangle_multiplication_outgoing.num_intermediate_channel': 14,
      f'{evo}.evoformer.triangle_multiplication_incoming.num_intermediate_channel': 14,
      f'{tpl_key}.num_channels': 10,
      f'{tpl_key}.template_pair_stack.triangle_multiplication_outgoing.num_intermediate_channel': 6,
      f'{tpl_key}.template_pair_stack.triangle_multiplication_incoming.num_intermediate_channel': 6,
      'model.heads.structure_module.num_channel': 32,
      'model.heads.structure_module.num_head': 3,
      'model.heads.structure_module.num_scalar_qk': 5,
      'model.heads.structure_module.num_scalar_v': 7,
      'model.heads.structure_module.num_point_qk': 2,
      'model.heads.structure_module.num_point_v': 4,
      'model.heads.structure_module.sidechain.num_channel': 18,
      'model.heads.predicted_lddt.num_channels': 22,
  }


def save_npz_compressed(path, arrays):
  """Byte-deterministic compressed npz (fixed timestamps, sorted keys)."""
  import numpy as np
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with zipfile.ZipFile(path, 'w', compression=zipfile.ZIP_DEFLATED) as zf:
    for key in sorted(arrays):
      buf = io.BytesIO()
      np.lib.format.write_array(buf, np.array(arrays[key], order='C', copy=True),
                                allow_pickle=False)
      info = zipfile.ZipInfo(key + '.npy', date_time=(1980, 1, 1, 0, 0, 0))
      info.compress_type = zipfile.ZIP_DEFLATED
      info.external_attr = 0o644 << 16
      zf.writestr(info, buf.getvalue())


def install_unit_vector_observer(seen):
  """Record the inputs of template_pair_embedding_{4,5,6} (observation only)."""
  import jax
  import numpy as np
  from alphafold.model import common_modules
  linear_call = common_modules.Linear.__call__

  def observed(self, x):
    name = self.module_name
    if 'template_pair_embedding_' in name and name.split('_')[-1] in ('4', '5', '6'):
      jax.debug.callback(lambda v, n=name.split('_')[-1]: seen.setdefault(n, []).append(
          np.asarray(v)), x, ordered=True)
    return linear_call(self, x)
  common_modules.Linear.__call__ = observed


def unit_diagonal(seen, n_templates):
  import numpy as np
  unit = np.stack([np.stack(seen[c]) for c in ('4', '5', '6')], -1)
  unit = unit.reshape(-1, *unit.shape[-3:])                            # [passes * T, L, L, 3]
  passes = unit.reshape(-1, n_templates, *unit.shape[-3:])
  assert all(np.array_equal(passes[0], p) for p in passes[1:]), 'diagonal differs per pass'
  return np.einsum('tiic->tic', passes[0]).astype(np.float32)         # [T, L, 3]


def chain_features(mfm, tpl, data, raw_dir, db_path, mmcif_dir, tools):
  from alphafold.data import parsers, pipeline
  specs = {CHAIN_A: dict(mfm.CHAINS[CHAIN_A], date=mfm.MAX_TEMPLATE_DATE),
           CHAIN_B: dict(mfm.CHAINS[CHAIN_B], date=mfm.MAX_TEMPLATE_DATE),
           NO_TEMPLATE_CHAIN: dict(mfm.CHAINS['2p90_A02'], date=NO_TEMPLATE_DATE)}
  chains = {}
  for cname, spec in specs.items():
    text = tpl.read_a3m(os.path.join(data, spec['a3m']))
    if spec['crop'] is not None or spec['max_records'] is not None:
      qlen = len(parsers.parse_a3m(text).sequences[0])
      start, end = (spec['crop'][0] - 1, spec['crop'][1]) if spec['crop'] else (0, qlen)
      text = tpl.crop_a3m(text, start, end, spec['max_records'])
    msa = parsers.parse_a3m(text)
    query = msa.sequences[0]
    tpl.save_text(os.path.join(raw_dir, f'{cname}.a3m'), text)
    tres, hits = tpl.template_search(dict(name=cname, max_template_date=spec['date']), query,
                                     text, db_path, mmcif_dir, tools, raw_dir)
    feats = {**pipeline.make_sequence_features(sequence=query, description=cname,
                                               num_res=len(query)),
             **pipeline.make_msa_features([msa]), **tres.features}
    chains[cname] = dict(spec=spec, a3m=text, query=query, feats=feats, hits=hits,
                         templates=[bytes(x).decode() for x in tres.features['template_domain_names']])
  pool = mfm.species_of_uniprot_rows(chains[CHAIN_A]['a3m'], mfm.CHAINS[CHAIN_A]['uniprot'][1])
  for cname, c in chains.items():
    c['uniprot_sto'] = None
    if c['spec']['uniprot'] is not None:
      c['uniprot_sto'], c['synthetic_species'] = mfm.make_uniprot_sto(
          cname, c['a3m'], c['spec']['uniprot'], pool)
      tpl.save_text(os.path.join(raw_dir, f'{cname}.uniprot_hits.sto'), c['uniprot_sto'])
  return chains


def case_features(mfm, tpl, chains, spec, tmp, raw_dir):
  import numpy as np
  from alphafold.data import pipeline_multimer
  fasta = ''.join(f'>{c}\n{chains[c]["query"]}\n' for c in spec['chains'])
  tpl.save_text(os.path.join(raw_dir, f'{spec["name"]}.fasta'), fasta)
  fasta_path = os.path.join(tmp, f'{spec["name"]}.fasta')
  tpl.save_text(fasta_path, fasta)
  msa_dir = os.path.join(tmp, f'msas_{spec["name"]}')
  os.makedirs(msa_dir)
  ids = list(pipeline_multimer.protein.PDB_CHAIN_IDS[:len(spec['chains'])])
  for cid, c in zip(ids, spec['chains']):
    if chains[c]['uniprot_sto'] is not None:
      os.makedirs(os.path.join(msa_dir, cid), exist_ok=True)
      tpl.save_text(os.path.join(msa_dir, cid, 'uniprot_hits.sto'), chains[c]['uniprot_sto'])
  dp = pipeline_multimer.DataPipeline.__new__(pipeline_multimer.DataPipeline)
  dp._monomer_data_pipeline = mfm._PrecomputedMonomerPipeline(  # pylint: disable=protected-access
      {chains[c]['query']: chains[c]['feats'] for c in spec['chains']})
  dp._uniprot_msa_runner = None  # pylint: disable=protected-access
  dp._max_uniprot_hits = mfm.MAX_UNIPROT_HITS  # pylint: disable=protected-access
  dp.use_precomputed_msas = True
  np_example = dp.process(input_fasta_path=fasta_path, msa_output_dir=msa_dir)
  with open(os.path.join(msa_dir, 'chain_id_map.json')) as f:
    chain_id_map = json.load(f)
  return {k: np.asarray(v) for k, v in np_example.items()}, chain_id_map


def make_params(mfm, tpl, cfg, first_feat, out):
  """forward.init, fixture A's re-randomisation (seed PARAM_RERANDOM_SEED), AlphaFold's flat
  npz naming, reloaded with get_model_haiku_params."""
  import haiku as hk
  import jax
  import numpy as np
  from alphafold.model import data as af_data
  init = hk.data_structures.to_mutable_dict(make_forward(cfg).init(
      jax.random.PRNGKey(mfm.PARAM_INIT_KEY), jax.tree_util.tree_map(jax.numpy.asarray,
                                                                     first_feat)))
  tpl.PARAM_RERANDOM_SEED = PARAM_RERANDOM_SEED
  tpl.RELU_GAIN_LEAVES.clear()
  params = tpl.rerandomise(init)
  tpl.save_npz(os.path.join(out, 'params', f'params_{SMALL_MODEL_NAME}.npz'),
               tpl.flatten_params(params))
  loaded = af_data.get_model_haiku_params(SMALL_MODEL_NAME, out)
  for scope in params:
    for n in params[scope]:
      assert np.array_equal(np.asarray(loaded[scope][n]), params[scope][n])
  return loaded, params


def make_forward(cfg):
  import haiku as hk

  def forward_fn(batch):
    from alphafold.model import modules_multimer
    return modules_multimer.AlphaFold(cfg.model)(batch, is_training=False,
                                                 return_representations=True)
  return hk.transform(forward_fn)


def run_cases(mfm, cfg, loaded, params, chains, cases, seen, out):
  """jit(apply) with PRNGKey(0) per case; the kept outputs, sampling and unit diagonal."""
  import jax
  import numpy as np
  apply = jax.jit(make_forward(cfg).apply)
  summary = {'num_params': int(sum(v.size for s in params.values() for v in s.values())),
             'chains': {k: {'query': c['query'], 'templates_found': c['templates']}
                        for k, c in chains.items()}, 'cases': {}}
  for case in cases:
    seen.clear()
    outputs, sampled, conf = mfm.run_and_collect(apply, loaded, case['feat'])
    n_templates = case['feat']['template_aatype'].shape[0]
    kept = {k: outputs[k] for k in KEEP_OUTPUTS}
    kept_sampled = {k: sampled[k] for k in KEEP_SAMPLED}
    kept_sampled['template_unit_diagonal'] = unit_diagonal(seen, n_templates)
    save_npz_compressed(os.path.join(out, f'outputs_{case["name"]}.npz'), kept)
    save_npz_compressed(os.path.join(out, f'sampled_msa_{case["name"]}.npz'), kept_sampled)
    summary['cases'][case['name']] = {
        'note': case['note'], 'chains': case['chains'], 'chain_id_map': case['chain_id_map'],
        'num_res': int(case['feat']['aatype'].shape[0]), 'num_templates_slots': n_templates,
        'templates_real': int((case['feat']['template_all_atom_mask'].sum((1, 2)) > 0).sum()),
        'num_recycles_run': int(outputs['num_recycles']),
        'plddt_mean': float(np.mean(conf['plddt'])), 'ptm': float(conf['ptm']),
        'iptm': float(conf['iptm']),
        'unit_diagonal_max_norm': float(np.linalg.norm(kept_sampled['template_unit_diagonal'],
                                                       axis=-1).max())}
  return summary


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--reference', required=True, help='af2_reference/multimer folder')
  parser.add_argument('--data', required=True)
  parser.add_argument('--out', required=True)
  args = parser.parse_args()
  sys.path.insert(0, os.path.abspath(args.reference))
  import make_fixture_multimer as mfm  # sets the XLA flags (via make_fixture_templates)
  import haiku as hk
  import jax
  import numpy as np
  from alphafold.model import config as af_config
  tpl = mfm.tpl
  t_start, out = time.time(), args.out
  raw_dir = os.path.join(out, 'raw_inputs')
  overrides = dict(mfm.CONFIG_OVERRIDES)
  overrides.update(width_overrides(mfm.EVO, mfm.TPL))
  cfg = af_config.model_config(mfm.MODEL_NAME)
  cfg.update_from_flattened_dict(overrides)
  mfm.install_recorders()
  seen = {}
  install_unit_vector_observer(seen)
  tools = {k: shutil.which(k) for k in ('hmmsearch', 'hmmbuild', 'kalign')}
  tmp = tempfile.mkdtemp(prefix='af2mmb_')
  mmcif_dir = os.path.join(tmp, 'mmcif')
  os.makedirs(mmcif_dir)
  db_fasta, _ = tpl.build_template_db(args.data, mmcif_dir)
  db_path = os.path.join(tmp, 'pdb_seqres.txt')
  tpl.save_text(db_path, db_fasta)
  chains = chain_features(mfm, tpl, args.data, raw_dir, db_path, mmcif_dir, tools)
  cases = []
  for spec in CASES:
    feat, chain_id_map = case_features(mfm, tpl, chains, spec, tmp, raw_dir)
    save_npz_compressed(os.path.join(out, f'features_{spec["name"]}.npz'), feat)
    cases.append(dict(spec, feat=feat, chain_id_map=chain_id_map))
  shutil.rmtree(tmp)

  loaded, params = make_params(mfm, tpl, cfg, cases[0]['feat'], out)
  summary = run_cases(mfm, cfg, loaded, params, chains, cases, seen, out)
  tpl.save_json(os.path.join(out, f'config_{SMALL_MODEL_NAME}.json'), {
      'base_model': mfm.MODEL_NAME, 'overrides': overrides,
      'config': tpl._to_jsonable(cfg.to_dict()),  # pylint: disable=protected-access
      'cases': [{k: v for k, v in c.items() if k != 'feat'} for c in cases],
      'provenance': {'versions': {'jax': jax.__version__, 'dm-haiku': hk.__version__,
                                  'numpy': np.__version__},
                     'xla_flags': os.environ['XLA_FLAGS'],
                     'param_rerandom_seed': PARAM_RERANDOM_SEED}})
  summary['total_s'] = time.time() - t_start
  tpl.save_json(os.path.join(out, 'summary.json'), summary)
  print(json.dumps(summary, indent=1))


if __name__ == '__main__':
  main()
