# Real-repo patterns: a module-level DEVICE constant (RAFT demo.py) and a device_map default (Open-Sora
# opensora/models/mmdit/model.py, vae/autoencoder_2d.py, dc_ae/ae_model_zoo.py: `with torch.device(device_map):`).
import torch

DEVICE = "cuda"  # expect: NPU310


def load_image(img):
    return torch.from_numpy(img).permute(2, 0, 1).float()[None].to(DEVICE)


def Flux(config, device_map: str = "cuda", torch_dtype=torch.bfloat16):  # expect: NPU310
    with torch.device(device_map):
        model = torch.nn.Linear(4, 4)
    return model.to(torch_dtype)


def encode(pipe, prompt):
    # HunyuanVideo-1.5 hyvideo/pipelines/hunyuan_video_pipeline.py: a keyword ending in _device
    return pipe.encode_prompt(prompt, execution_device="cuda")  # expect: NPU310
