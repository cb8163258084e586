#!/usr/bin/env python3
"""Writes tests/fixtures/grammar/cases.json: strings labelled by external oracles, for
tests/unit/test_grammar.c to check the grammar engine against.

- GBNF grammars written to mean the same as a Python regular expression: each string is
  labelled by re.fullmatch.
- JSON mode (any object): labelled by json.loads (NaN / Infinity refused) and being a dict.
- JSON Schemas: labelled by json.loads and jsonschema's validator.

Strings are random samples and mutations of valid ones. The engine's JSON grammars are
narrower than JSON in two documented ways -- whitespace between tokens is none, one space
or a newline and at most 24 blanks, and objects of a schema with properties list them in
order -- so the samples keep to that (mutations never touch whitespace or reorder keys).
usage: tools/gen_grammar_fixtures.py [out.json]   (needs: jsonschema)"""
import json
import random
import re
import sys

import jsonschema

rng = random.Random(20261201)

REGEX_GROUPS = [
    # (GBNF, Python regex, alphabet for random strings)
    ('root ::= [a-c]+ "x"? ("yz"){1,3}', r'[a-c]+x?(yz){1,3}', 'abcxyz'),
    ('root ::= ("ab" | "a" "c"*)* "d"', r'(ab|ac*)*d', 'abcd'),
    ('root ::= [^a-z]{2} "\u00e9" .', r'[^a-z]{2}\u00e9.', 'az\u00e9\u4e2d1 \n'),
    ('root ::= "\\x41" [\\u00e0-\\u00ff]+ "\\n"', 'A[\u00e0-\u00ff]+\n', 'A\u00e0\u00ff\u00df\u0100\nB'),
    ('root ::= item ("," item){0,2}\nitem ::= [0-9] | "(" [0-9]+ ")"',
     r'(\d|\(\d+\))(,(\d|\(\d+\))){0,2}', '0123(),'),
    ('# comment\nroot ::= (\n  "if" ws cond\n  | "go"\n) "!"?\nws ::= " "+\ncond ::= [xy]{2,}',
     r'(if +[xy]{2,}|go)!?', 'ifgoxy !'),
    ('root ::= [\\U0001F600-\\U0001F64F] "-" [\\[\\]\\-]', '[\U0001F600-\U0001F64F]-[\\[\\]\\-]',
     '\U0001F600\U0001F64F\U0001F650-[]x'),
]


def rs(alpha, lo, hi):
    return ''.join(rng.choice(alpha) for _ in range(rng.randint(lo, hi)))


# strings built to match each regex above (the labels still come from re.fullmatch)
REGEX_SAMPLES = [
    lambda: rs('abc', 1, 4) + rs('x', 0, 1) + 'yz' * rng.randint(1, 3),
    lambda: ''.join(rng.choice(['ab', 'a' + rs('c', 0, 3)]) for _ in range(rng.randint(0, 3))) + 'd',
    lambda: rs('AZ19 \n\u4e2d', 2, 2) + '\u00e9' + rs('az\n\u00e9\u4e2d', 1, 1),
    lambda: 'A' + rs('\u00e0\u00ff\u00df\u00f0', 1, 4) + '\n',
    lambda: ','.join(rng.choice([rs('0123', 1, 1), '(' + rs('0123', 1, 3) + ')'])
                     for _ in range(rng.randint(1, 3))),
    lambda: rng.choice(['if' + rs(' ', 1, 3) + rs('xy', 2, 4), 'go']) + rs('!', 0, 1),
    lambda: rng.choice(['\U0001F600', '\U0001F620', '\U0001F64F']) + '-' + rng.choice('[]-'),
]


# regular expressions, translated by the engine (irt_grammar_regex); labels from
# re.fullmatch with re.ASCII (the engine's \d \w \s are ASCII; its . is not a newline)
REGEXES = [
    (r'\(\d{3}\) \d{3}-\d{4}', '0123456789() -x',
     lambda: '(%03d) %03d-%04d' % (rng.randint(0, 999), rng.randint(0, 999), rng.randint(0, 9999))),
    (r'[a-z]+@[a-z]+\.(com|org)', 'abz@.comrgx',
     lambda: rs('abz', 1, 4) + '@' + rs('xyz', 1, 3) + '.' + rng.choice(['com', 'org'])),
    (r'^(\w+\s?){1,3}[.!?]$', 'ab_1 \t\n.!?-\u00e9',
     lambda: ''.join(rs('ab_1', 1, 3) + rs(' \t\n', 0, 1) for _ in range(rng.randint(1, 3))) +
     rng.choice('.!?')),
    (r'[^"\\]*"x\\', 'ab"\\x\n\u00e9',
     lambda: rs('ab\n\u00e9', 0, 4) + '"x\\'),
    (r'a.c|\x41\u00e9+', 'ac\nA\u00e9b',
     lambda: rng.choice(['a' + rng.choice('bc\u00e9 ') + 'c', 'A' + '\u00e9' * rng.randint(1, 3)])),
    (r'(ab|cd)*?e{2,}', 'abcde',
     lambda: ''.join(rng.choice(['ab', 'cd']) for _ in range(rng.randint(0, 3))) + 'e' * rng.randint(1, 4)),
]


def rand_string(alpha, n):
    return ''.join(rng.choice(alpha) for _ in range(n))


def regex_cases(rx, alpha, sample):
    cases = {}
    pat = re.compile(rx, re.DOTALL)
    for _ in range(300):
        s = rand_string(alpha, rng.randint(0, 9))
        cases[s] = bool(pat.fullmatch(s))
    for _ in range(150):
        s = sample()
        cases[s] = bool(pat.fullmatch(s))
        for _ in range(2):
            m = list(s)
            i = rng.randrange(len(m) + 1)
            op = rng.randint(0, 2)
            if op == 0 and i < len(m):
                del m[i]
            elif op == 1 and i < len(m):
                m[i] = rng.choice(alpha)
            else:
                m.insert(i, rng.choice(alpha))
            cases[''.join(m)] = bool(pat.fullmatch(''.join(m)))
    return cases


def rand_value(depth):
    k = rng.randint(0, 6 if depth < 3 else 4)
    if k == 0:
        return rng.choice([True, False, None])
    if k == 1:
        return rng.randint(-1000, 100000)
    if k == 2:
        return round(rng.uniform(-100, 100), rng.randint(0, 4))
    if k in (3, 4):
        return rand_string('abc xyz\u00e9\u4e2d"\\\n\t/', rng.randint(0, 6))
    if k == 5:
        return [rand_value(depth + 1) for _ in range(rng.randint(0, 3))]
    return rand_object(depth + 1)


def rand_object(depth):
    return {rand_string('abkey_', rng.randint(1, 5)): rand_value(depth)
            for _ in range(rng.randint(0, 3))}


def dumps(v):
    style = rng.randint(0, 2)
    if style == 0:
        return json.dumps(v, ensure_ascii=rng.random() < 0.5)
    if style == 1:
        return json.dumps(v, separators=(',', ':'), ensure_ascii=False)
    return json.dumps(v, indent=2, ensure_ascii=False)


def mutate(s):
    """A change that touches no whitespace, so the narrower whitespace rule never decides."""
    for _ in range(20):
        i = rng.randrange(len(s) + 1)
        op = rng.randint(0, 2)
        if op < 2 and (i == len(s) or s[i].isspace()):
            continue
        c = rng.choice('{}[],:"\\0123456789.eE-+tfnulax\u00e9')
        if op == 0:
            return s[:i] + s[i + 1:]
        if op == 1:
            return s[:i] + c + s[i + 1:]
        if (i > 0 and s[i - 1].isspace()) and (i < len(s) and s[i].isspace()):
            continue
        return s[:i] + c + s[i:]
    return s + '}'


def no_constants(name):
    raise ValueError(name)


def json_label(s, schema):
    try:
        v = json.loads(s, parse_constant=no_constants)
    except ValueError:
        return False
    if schema is None:
        return isinstance(v, dict)
    try:
        jsonschema.validate(v, schema)
        return True
    except jsonschema.ValidationError:
        return False


SCHEMAS = [
    ({'type': 'object', 'additionalProperties': False,
      'properties': {'name': {'type': 'string', 'maxLength': 8},
                     'age': {'type': 'integer'},
                     'tags': {'type': 'array', 'items': {'enum': ['a', 'b', 1]}, 'maxItems': 3},
                     'ok': {'type': ['boolean', 'null']}},
      'required': ['name', 'age']},
     lambda: {k: v for k, v in [('name', rand_string('ab\u00e9', rng.randint(0, 9))),
                                ('age', rng.randint(-50, 200)),
                                ('tags', [rng.choice(['a', 'b', 1]) for _ in range(rng.randint(0, 4))]),
                                ('ok', rng.choice([True, False, None]))]
              if k in ('name', 'age') or rng.random() < 0.6}),
    ({'$defs': {'node': {'type': 'object', 'additionalProperties': False,
                         'properties': {'v': {'type': 'number'},
                                        'kids': {'type': 'array', 'items': {'$ref': '#/$defs/node'}}},
                         'required': ['v']}},
      '$ref': '#/$defs/node'},
     lambda: rand_tree(0)),
    ({'anyOf': [{'type': 'string', 'minLength': 2}, {'const': {'x': [1, 2]}},
                {'type': 'array', 'prefixItems': [{'type': 'integer'}, {'type': 'string'}],
                 'items': False}]},
     lambda: rng.choice([rand_string('xy', rng.randint(0, 4)), {'x': [1, 2]},
                         [rng.randint(0, 9), rand_string('q', rng.randint(0, 2))]])),
    ({'type': 'object', 'properties': {'id': {'type': 'integer'}},
      'additionalProperties': {'type': 'string'}},
     lambda: dict([('id', rng.randint(0, 9))] * (rng.random() < 0.8) +
                  [(rand_string('pq', 2), rand_string('st', rng.randint(0, 3)))
                   for _ in range(rng.randint(0, 2))])),
]


SCHEMAS.append(
    ({'type': 'object', 'additionalProperties': False, 'required': ['code', 'note'],
      'properties': {'code': {'type': 'string', 'pattern': '^[A-Z]{2}-\\d{3}$'},
                     'note': {'type': 'string', 'pattern': 'a"b|\\\\n'}}},
     lambda: {'code': rs('AZ', 2, 2) + '-' + rs('0123456789', 3, 3) if rng.random() < 0.8
              else rs('AZ-19', 3, 7),
              'note': rs('xa\n', 0, 2) + rng.choice(['a"b', '\\n', 'ab']) + rs('"y\\', 0, 2)}))


def near(lo, hi, *points):
    """Mostly an integer in [lo, hi]; else one at or next to a bound or point, or far off."""
    u = rng.random()
    if u < 0.7:
        return rng.randint(lo, hi)
    if u < 0.9:
        return rng.choice((lo, hi) + points) + rng.randint(-1, 1)
    return rng.randint(lo - 50, hi + 50) * rng.choice([1, 10, 1000, -1])


SCHEMAS.append(
    ({'type': 'object', 'additionalProperties': False, 'required': ['a', 'b', 'c', 'd', 'e'],
      'properties': {'a': {'type': 'integer', 'minimum': -37, 'maximum': 1205},
                     'b': {'type': 'integer', 'exclusiveMinimum': 99},
                     'c': {'type': 'integer', 'maximum': -8},
                     'd': {'type': 'integer', 'minimum': 0, 'exclusiveMaximum': 10},
                     'e': {'type': ['integer', 'null'], 'minimum': 2.5, 'maximum': 100000}}},
     lambda: {'a': near(-37, 1205, 0, 9, 10, 99, 100, 1000), 'b': near(100, 5000, 999),
              'c': near(-300, -8, -10, -100), 'd': near(0, 9),
              'e': None if rng.random() < 0.1 else near(3, 100000, 9, 99999)}))


def mutate_any(s, alpha):
    m = list(s)
    i = rng.randrange(len(m) + 1)
    op = rng.randint(0, 2)
    if op == 0 and i < len(m):
        del m[i]
    elif op == 1 and i < len(m):
        m[i] = rng.choice(alpha)
    else:
        m.insert(i, rng.choice(alpha))
    return ''.join(m)


def rand_tree(depth):
    n = {'v': rng.choice([rng.randint(-9, 9), round(rng.uniform(0, 1), 3)])}
    if depth < 3 and rng.random() < 0.5:
        n['kids'] = [rand_tree(depth + 1) for _ in range(rng.randint(0, 2))]
    return n


WS_RUN = re.compile(r'( |\n[ \t]{0,24})?')


def ws_ok(s):
    """Whether every run of blanks outside strings is one the engine's JSON grammar takes."""
    runs, run, in_str, esc = [], '', False, False
    for c in s:
        if in_str:
            in_str = esc or c != '"'
            esc = not esc and c == '\\'
        elif c in ' \t\n\r':
            run += c
            continue
        else:
            in_str = c == '"'
        runs.append(run)
        run = ''
    runs.append(run)
    return all(WS_RUN.fullmatch(r) for r in runs) and not s[:1].isspace() and not s[-1:].isspace()


def json_cases(schema, sample):
    cases = {}
    for _ in range(150):
        for s in (dumps(sample()),):
            for t in (s, mutate(s)):
                if ws_ok(t):
                    cases[t] = json_label(t, schema)
    return cases


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else 'tests/fixtures/grammar/cases.json'
    groups = []
    for (gbnf, rx, alpha), sample in zip(REGEX_GROUPS, REGEX_SAMPLES):
        groups.append({'gbnf': gbnf, 'oracle': 're.fullmatch(%r)' % rx,
                       'cases': sorted(regex_cases(rx, alpha, sample).items())})
    for rx, alpha, sample in REGEXES:
        pat = re.compile(rx, re.ASCII)
        cases = {}
        for _ in range(200):
            t = sample()
            for u in (t, mutate_any(t, alpha)):
                cases[u] = bool(pat.fullmatch(u))
        groups.append({'regex': rx, 'oracle': 're.fullmatch(%r, re.ASCII)' % rx,
                       'cases': sorted(cases.items())})
    groups.append({'json_object': True, 'oracle': 'json.loads, a dict',
                   'cases': sorted(json_cases(None, lambda: rand_object(0)).items())})
    for schema, sample in SCHEMAS:
        groups.append({'schema': schema, 'oracle': 'json.loads + jsonschema.validate',
                       'cases': sorted(json_cases(schema, sample).items())})
    with open(out, 'w', encoding='utf-8') as f:
        json.dump({'generator': 'tools/gen_grammar_fixtures.py', 'groups': groups}, f,
                  ensure_ascii=False, indent=0)
        f.write('\n')
    n = sum(len(g['cases']) for g in groups)
    pos = sum(v for g in groups for _, v in g['cases'])
    print('%s: %d groups, %d strings (%d accepted)' % (out, len(groups), n, pos))


if __name__ == '__main__':
    main()
