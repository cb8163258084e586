"""An offline batch script written against vLLM's API, as its users write them. The test
(test_vllm_compat.py) runs it with the import lines' `vllm` replaced by `inferrt` and
nothing else changed. usage: vllm_offline_script.py MODEL"""
import json
import sys

from vllm import LLM, SamplingParams
from vllm.sampling_params import GuidedDecodingParams

prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]


def main():
    llm = LLM(model=sys.argv[1], seed=0)
    results = {}

    # plain sampling over a batch of prompts
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=32, seed=42)
    outputs = llm.generate(prompts, sampling_params)
    results["sampled"] = []
    for output in outputs:
        prompt = output.prompt
        generated_text = output.outputs[0].text
        print(f"Prompt: {prompt!r}, Generated text: {generated_text!r}", file=sys.stderr)
        results["sampled"].append({"prompt": prompt, "text": generated_text,
                                   "token_ids": list(output.outputs[0].token_ids),
                                   "finish_reason": output.outputs[0].finish_reason})

    # greedy, several completions, logprobs
    greedy = SamplingParams(temperature=0.0, max_tokens=16, logprobs=2)
    out = llm.generate("The capital of France is", greedy)[0]
    results["greedy"] = {"text": out.outputs[0].text, "ids": list(out.outputs[0].token_ids),
                         "cum": out.outputs[0].cumulative_logprob,
                         "n_lp": [len(d) for d in out.outputs[0].logprobs]}
    many = llm.generate(prompts[0], SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=8))
    results["n"] = [list(c.token_ids) for c in many[0].outputs]

    # chat
    conversation = [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "Write a one-line poem about the sea."},
    ]
    out = llm.chat(conversation, SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)
    results["chat"] = {"text": out[0].outputs[0].text, "prompt_ids": out[0].prompt_token_ids}

    # structured outputs
    guided = GuidedDecodingParams(choice=["Positive", "Negative"])
    out = llm.generate("Classify this sentiment: vLLM is wonderful!",
                       SamplingParams(guided_decoding=guided, max_tokens=8))
    results["choice"] = out[0].outputs[0].text
    schema = {"type": "object", "properties": {"brand": {"type": "string", "maxLength": 12},
                                               "year": {"type": "integer"}},
              "required": ["brand", "year"]}
    out = llm.generate("Describe a car in JSON:",
                       SamplingParams(guided_decoding=GuidedDecodingParams(json=schema),
                                      temperature=0, max_tokens=64))
    results["json"] = out[0].outputs[0].text

    tokenizer = llm.get_tokenizer()
    ids = tokenizer.encode("The capital of France is")
    results["tokens"] = ids
    results["roundtrip"] = tokenizer.decode(ids, skip_special_tokens=True)
    results["template"] = tokenizer.apply_chat_template(conversation, tokenize=False,
                                                        add_generation_prompt=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
