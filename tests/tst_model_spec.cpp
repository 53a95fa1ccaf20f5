// The model spec: parameter counts against published figures, Hugging Face names and layouts, layer names,
// FLOPs and activation bytes per sample.
#include <QtTest>

#include <cmath>

#include "plan/model_spec.h"

using namespace ms;

class TestModelSpec : public QObject {
  Q_OBJECT
 private slots:
  // GPT-2 small (Radford et al. 2019): 12 layers, width 768, 12 heads, context 1024, vocab 50257, tied head:
  // 124,439,808 parameters, the count of the Hugging Face "gpt2" checkpoint.
  void gpt2SmallParameterCount() {
    ModelConfig m;
    m.layers = 12;
    m.width = 768;
    m.heads = 12;
    m.context = 1024;
    m.vocab = 50257;
    const ModelSpec spec = buildModelSpec(m, 1024);
    QCOMPARE(spec.paramCount(), int64_t(124439808));
    QCOMPARE(static_cast<int>(spec.layers.size()), 14);
    QCOMPARE(spec.layers.front().name, std::string("embedding"));
    QCOMPARE(spec.layers[5].name, std::string("block.4"));
    QCOMPARE(spec.layers.back().name, std::string("head"));
    // Hugging Face layout: c_attn.weight is (C, 3C) Conv1D.
    const ParamSpec& qkv = spec.layers[1].params[2];
    QCOMPARE(qkv.name, std::string("h.0.attn.c_attn.weight"));
    QCOMPARE(qkv.shape, (std::vector<int64_t>{768, 2304}));
    QVERIFY(qkv.decay);
    QVERIFY(!spec.layers[1].params[0].decay);  // ln_1.weight
    // Untied adds the (V, C) LM head.
    m.tieEmbeddings = false;
    QCOMPARE(buildModelSpec(m, 1024).paramCount(), int64_t(124439808) + int64_t(50257) * 768);
  }

  // Llama 3 8B (Grattafiori et al. 2024, table 3: 32 layers, width 4096, 32 heads, 8 key/value heads, FFN
  // 14336, vocabulary 128256, untied): 8,030,261,248 parameters, the count of the Hugging Face
  // "Meta-Llama-3-8B" checkpoint. Llama 2 7B (Touvron et al. 2023; multi-head, FFN by Meta's rule, 11008,
  // vocabulary 32000): 6,738,415,616. Names and (out, in) shapes are Hugging Face's.
  void llamaParameterCounts() {
    ModelConfig m;
    m.type = ModelType::Llama;
    m.layers = 32;
    m.width = 4096;
    m.heads = 32;
    m.kvHeads = 8;
    m.ffnHidden = 14336;
    m.vocab = 128256;
    m.tieEmbeddings = false;
    const ModelSpec spec = buildModelSpec(m, 8192);
    QCOMPARE(spec.paramCount(), int64_t(8030261248));
    QCOMPARE(static_cast<int>(spec.layers.size()), 34);
    const LayerSpec& block = spec.layers[1];
    QCOMPARE(block.params[2].name, std::string("model.layers.0.self_attn.k_proj.weight"));
    QCOMPARE(block.params[2].shape, (std::vector<int64_t>{1024, 4096}));
    QCOMPARE(block.params[8].name, std::string("model.layers.0.mlp.down_proj.weight"));
    QCOMPARE(block.params[8].shape, (std::vector<int64_t>{4096, 14336}));
    QCOMPARE(spec.layers.front().params[0].name, std::string("model.embed_tokens.weight"));
    QCOMPARE(spec.layers.back().params.back().name, std::string("lm_head.weight"));
    // Tensor parallelism splits every block matrix (q, k, v, gate, up by rows, o and down by columns) and
    // keeps the two RMSNorm weights whole.
    QCOMPARE(block.splitParamCount, block.paramCount() - 2 * 4096);
    QCOMPARE(block.localParamCount(8), (block.paramCount() - 2 * 4096) / 8 + 2 * 4096);
    QVERIFY((shardSpecOf(block.params[4], ModelType::Llama).dim == 1));  // o_proj: row-parallel
    QVERIFY((shardSpecOf(block.params[6], ModelType::Llama).dim == 0));  // gate_proj: column-parallel
    // Forward FLOPs per position: 2 (q, k, v, o, gate, up, down) weights + causal attention 2 T C.
    const double perPosition =
        2.0 * (4096.0 * (4096 + 2 * 1024) + 4096.0 * 4096 + 3.0 * 4096 * 14336) + 2.0 * 8192 * 4096;
    QCOMPARE(block.forwardFlopsPerSample, perPosition * 8192);

    m.layers = 32;
    m.kvHeads = 0;
    m.ffnHidden = 0;
    m.vocab = 32000;
    QCOMPARE(llamaFfnHidden(4096), int64_t(11008));
    QCOMPARE(buildModelSpec(m, 4096).paramCount(), int64_t(6738415616));
  }

  // Mixtral 8x7B (Jiang et al. 2024: Mistral 7B's blocks, 8 experts of 14336, 2 a token): 46,702,792,704
  // parameters (the Hugging Face checkpoint's count), 12.9B of them active a token; a shared expert and a
  // dense first block change the count by their matrices.
  void mixtralParameterCount() {
    ModelConfig m;
    m.type = ModelType::Llama;
    m.layers = 32;
    m.width = 4096;
    m.heads = 32;
    m.kvHeads = 8;
    m.ffnHidden = 14336;
    m.vocab = 32000;
    m.tieEmbeddings = false;
    m.experts = 8;
    m.expertsPerToken = 2;
    const ModelSpec spec = buildModelSpec(m, 4096);
    QCOMPARE(spec.paramCount(), int64_t(46702792704));
    const LayerSpec& block = spec.layers[1];
    QCOMPARE(block.params[6].name, std::string("model.layers.0.mlp.gate.weight"));
    QVERIFY(!shardSpecOf(block.params[6], ModelType::Llama).sharded());  // the router: replicated
    QCOMPARE(block.params[7].name, std::string("model.layers.0.mlp.experts.0.gate_proj.weight"));
    QVERIFY((shardSpecOf(block.params[9], ModelType::Llama).dim == 1));  // an expert's down: row-parallel
    // FLOPs a position: attention's GEMMs, the router and two experts' SwiGLUs (not eight), causal attention.
    const double perPosition =
        2.0 * (4096.0 * (4096 + 2 * 1024) + 4096.0 * 4096 + 3.0 * 4096 * 14336 * 2 + 4096.0 * 8) +
        2.0 * 4096 * 4096;
    QCOMPARE(block.forwardFlopsPerSample, perPosition * 4096);
    m.sharedExperts = 1;
    m.denseLayers = 1;
    // Block 0 dense (3 matrices of 14336 instead of the router and 8 experts), the others one more expert.
    const int64_t expert = 3 * int64_t(4096) * 14336;
    QCOMPARE(buildModelSpec(m, 4096).paramCount(),
             int64_t(46702792704) - (8 * expert + 8 * 4096) + expert + 31 * expert);
  }

  // Forward FLOPs of a block: 2 * 12 C^2 per position for the GEMMs (Kaplan et al. 2020, table 1: 2N per
  // token with N = 12 C^2 per layer) plus attention's 2 * 2 * T * C per position, halved when causal.
  void blockFlops() {
    ModelConfig m;
    m.width = 64;
    m.heads = 4;
    const int T = 32;
    const ModelSpec spec = buildModelSpec(m, T);
    const double gemm = 2.0 * T * 12 * 64 * 64;
    const double attn = 2.0 * 2.0 * T * T * 64 * 0.5;
    QCOMPARE(spec.layers[1].forwardFlopsPerSample, gemm + attn);
    m.type = ModelType::Vit;
    const ModelSpec vit = buildModelSpec(m, T);
    QCOMPARE(vit.samplePositions, 17);  // 16 patches of 7x7 + class token
    QCOMPARE(vit.layers[1].forwardFlopsPerSample, 2.0 * 17 * 12 * 64 * 64 + 2.0 * 2.0 * 17 * 17 * 64);
  }

  // The GEMM shapes a measured device's cost model times (LayerSpec::gemms) hold the layer's FLOPs: their
  // 2 rows n k plus attention's are the forward FLOPs, for every layer whose FLOPs are GEMMs and attention
  // (not gpt's embedding lookup or vit's pooling), dense and mixture-of-experts, gpt, llama, vit and mlp.
  // The kernels a profile times by name are among the layer's elementwise passes: their bytes within the
  // layer's (split ones within the split bytes), their count within the passes. And the gpt block names its
  // two LayerNorms over the positions at the width and its GELU over the MLP's width.
  void vectorKernelsAreAmongTheElementwisePasses() {
    ModelConfig m;
    m.layers = 2;
    m.width = 64;
    m.heads = 4;
    m.vocab = 300;
    std::vector<ModelSpec> specs = {buildModelSpec(m, 32)};
    m.type = ModelType::Vit;
    specs.push_back(buildModelSpec(m, 0));
    m.type = ModelType::Llama;
    m.kvHeads = 2;
    m.ffnHidden = 160;
    specs.push_back(buildModelSpec(m, 32));
    m.experts = 4;
    m.expertsPerToken = 2;
    m.sharedExperts = 1;
    specs.push_back(buildModelSpec(m, 32));
    for (const ModelSpec& spec : specs)
      for (const LayerSpec& l : spec.layers) {
        double whole = 0, split = 0;
        for (const VectorKernelUse& v : l.vectorKernels) (v.split ? split : whole) += v.bytesPerSample();
        QVERIFY2(whole <= l.elementwiseBytesPerSample && split <= l.splitElementwiseBytesPerSample,
                 l.name.c_str());
        QVERIFY(int(l.vectorKernels.size()) <= l.elementwisePasses);
      }
    const LayerSpec& block = specs[0].layers[1];
    QCOMPARE(block.vectorKernels.size(), size_t(3));
    QCOMPARE(int(block.vectorKernels[2].kind), int(VectorKernelUse::Kind::Gelu));
    QCOMPARE(block.vectorKernels[2].width, 256.0);
    QVERIFY(block.vectorKernels[2].split);
    QCOMPARE(block.vectorKernels[0].rowsPerSample, 32.0);
    QCOMPARE(block.vectorKernels[0].width, 64.0);
    QCOMPARE(specs[0].layers.back().vectorKernels.size(), size_t(1));  // ln_f
    // The llama block's two RMSNorms, its SwiGLU (12 bytes an element: gate and up read, one written) and its
    // rotary embedding over the q and k heads ((4 + 2) x 16); the mixture-of-experts block's shared expert's
    // SwiGLU and its routed rows' (2 a position).
    const LayerSpec& llama = specs[2].layers[1];
    QCOMPARE(llama.vectorKernels.size(), size_t(4));
    QCOMPARE(int(llama.vectorKernels[3].kind), int(VectorKernelUse::Kind::Rope));
    QCOMPARE(llama.vectorKernels[3].bytesPerSample(), 8.0 * 32 * 6 * 16);
    QVERIFY(llama.vectorKernels[3].split);
    QCOMPARE(int(llama.vectorKernels[0].kind), int(VectorKernelUse::Kind::RmsNorm));
    QCOMPARE(llama.vectorKernels[2].bytesPerSample(), 12.0 * 32 * 160);
    const LayerSpec& moe = specs[3].layers[1];
    QCOMPARE(moe.vectorKernels.size(), size_t(5));
    QCOMPARE(moe.vectorKernels[3].rowsPerSample, 64.0);
  }

  void gemmShapesHoldTheFlops() {
    const auto gemmFlops = [](const LayerSpec& l) {
      double f = 0;
      for (const GemmShape& g : l.gemms) f += 2.0 * g.rows * double(g.n) * double(g.k);
      return f + l.attentionFlopsPerSample;
    };
    ModelConfig m;
    m.layers = 2;
    m.width = 64;
    m.heads = 4;
    m.vocab = 300;
    for (int cp : {1, 2}) {
      const ModelSpec gpt = buildModelSpec(m, 32, 784, cp);
      for (size_t l = 1; l < gpt.layers.size(); ++l)
        QCOMPARE(gemmFlops(gpt.layers[l]), gpt.layers[l].forwardFlopsPerSample);
      QCOMPARE(gpt.layers[1].attentionKeys, 32.0);  // the whole sequence's keys under cp
      QCOMPARE(gpt.layers[1].attentionHeadSize, 16.0);
    }
    m.type = ModelType::Llama;
    m.kvHeads = 2;
    m.ffnHidden = 160;
    const ModelSpec llama = buildModelSpec(m, 32, 784, 2);
    for (const LayerSpec& l : llama.layers) QCOMPARE(gemmFlops(l), l.forwardFlopsPerSample);
    QCOMPARE(llama.layers[1].attentionHeadSize, 16.0);  // 64 / 4 heads (2 of k and v)
    m.experts = 4;
    m.expertsPerToken = 2;
    m.sharedExperts = 1;
    const ModelSpec moe = buildModelSpec(m, 32);
    QCOMPARE(moe.layers[1].experts, 4);
    for (const LayerSpec& l : moe.layers) QCOMPARE(gemmFlops(l), l.forwardFlopsPerSample);
    m.type = ModelType::Vit;
    m.experts = 0;
    const ModelSpec vit = buildModelSpec(m, 0);
    for (size_t l = 0; l + 1 < vit.layers.size(); ++l)
      QCOMPARE(gemmFlops(vit.layers[l]), vit.layers[l].forwardFlopsPerSample);
    QVERIFY(!vit.layers[1].attentionCausal);
    QCOMPARE(vit.layers[1].attentionHeadSize, 16.0);
    m.type = ModelType::Mlp;
    m.hidden = {100, 50};
    const ModelSpec mlp = buildModelSpec(m, 0, 784);
    for (const LayerSpec& l : mlp.layers) QCOMPARE(gemmFlops(l), l.forwardFlopsPerSample);
    QVERIFY(!mlp.layers[0].gemms[0].inputGradient);  // the images need no gradient
    QVERIFY(mlp.layers[1].gemms[0].inputGradient);
    // The cnn: each convolution one GEMM of its output positions by C KH KW by its output channels (im2col),
    // the stem's without an input gradient; the head's GEMM beside its pooling's adds.
    ModelConfig c;
    c.type = ModelType::Cnn;
    c.imageSize = 28;
    c.channels = {8, 16};
    c.blocks = 2;
    c.classes = 10;
    const ModelSpec cnn = buildModelSpec(c, 0);
    for (size_t l = 0; l + 1 < cnn.layers.size(); ++l) {
      QCOMPARE(gemmFlops(cnn.layers[l]), cnn.layers[l].forwardFlopsPerSample);
      QVERIFY(cnn.layers[l].elementwiseBytesPerSample > 0);
    }
    QVERIFY(!cnn.layers[0].gemms[0].inputGradient);
    QCOMPARE(cnn.layers[0].gemms[0].rows, 28.0 * 28);
    QCOMPARE(cnn.layers[3].gemms.size(), size_t(3));  // the first block of 16 channels: its 1x1 shortcut
    QCOMPARE(cnn.layers[3].gemms[0].rows, 14.0 * 14);
    QCOMPARE(cnn.layers[3].gemms[0].k, int64_t(8 * 9));
    const LayerSpec& head = cnn.layers.back();
    QCOMPARE(gemmFlops(head) + 16.0 * 14 * 14, head.forwardFlopsPerSample);
  }

  // Sequence parallelism (seqShards = tp): what passes from a block to the next is each rank's piece of the
  // sequence (Megatron-LM's layout); the embedding's output, the last block's and everything of a model
  // without transformer blocks stay whole.
  void sequencePiecesBetweenBlocks() {
    ModelConfig m;
    m.layers = 3;
    m.width = 64;
    m.heads = 4;
    m.vocab = 300;
    const ModelSpec whole = buildModelSpec(m, 32);
    const ModelSpec gpt = buildModelSpec(m, 32, 784, 1, 4);
    QCOMPARE(gpt.layers.size(), size_t(5));  // embedding, 3 blocks, head
    const std::vector<int> in = {1, 1, 4, 4, 1}, out = {1, 4, 4, 1, 1};
    for (size_t l = 0; l < gpt.layers.size(); ++l) {
      QCOMPARE(gpt.layers[l].inputPieces, in[l]);
      QCOMPARE(gpt.layers[l].outputPieces, out[l]);
      QCOMPARE(gpt.layers[l].outputBytesPerSample, whole.layers[l].outputBytesPerSample);
      QCOMPARE(gpt.layers[l].heldOutputBytesPerSample(), whole.layers[l].outputBytesPerSample / out[l]);
    }
    QCOMPARE(gpt.layers[1].heldOutputBytesPerSample(), int64_t(32 / 4 * 64 * 4));
    QCOMPARE(gpt.layers[1].heldOutputBytesPerSampleIn(Precision::Bf16), 32.0 / 4 * 64 * 2);
    // With context parallelism the pieces are of the rank's cp slice.
    m.type = ModelType::Llama;
    m.kvHeads = 2;
    m.ffnHidden = 160;
    const ModelSpec llama = buildModelSpec(m, 32, 784, 2, 2);
    QCOMPARE(llama.layers[2].heldOutputBytesPerSample(), int64_t(32 / 2 / 2 * 64 * 4));
    m.type = ModelType::Mlp;
    m.hidden = {100, 50};
    for (const LayerSpec& l : buildModelSpec(m, 0, 784, 1, 2).layers)
      QVERIFY(l.inputPieces == 1 && l.outputPieces == 1);
  }

  void vitAndMlpLayers() {
    ModelConfig m;
    m.type = ModelType::Vit;
    m.layers = 2;
    m.width = 32;
    m.pool = Pooling::Mean;
    const ModelSpec vit = buildModelSpec(m, 0);
    QCOMPARE(vit.samplePositions, 16);
    QCOMPARE(vit.layerNames(), modelLayerNames(m));
    QVERIFY(vit.layers[0].params.size() == 3);  // no class token with mean pooling
    m.type = ModelType::Mlp;
    m.hidden = {100, 50};
    const ModelSpec mlp = buildModelSpec(m, 0, 784);
    QCOMPARE(mlp.layerNames(), (std::vector<std::string>{"block.0", "block.1", "head"}));
    QCOMPARE(mlp.paramCount(), int64_t(784 * 100 + 100 + 100 * 50 + 50 + 50 * 10 + 10));
    QCOMPARE(mlp.layerIndex("head"), 2);
    QCOMPARE(mlp.layerIndex("embedding"), -1);
  }

  // The cnn against the same network written in PyTorch (torch.nn.Conv2d/BatchNorm2d/Linear, torchvision's
  // ResNet names, projection shortcuts; counted with /usr/bin/python3: sum(p.numel() for p in
  // net.parameters()), the running statistics of state_dict(), and a forward hook summing 2 * outputs * in *
  // KH * KW over the convolutions on one 28x28 image): channels {16, 32, 64} with 3 blocks a stage
  // (ResNet-20, He et al. 2016's "0.27M" with option B shortcuts) has 272,186 parameters, 1,568
  // running-statistics floats and 62,042,624 convolution FLOPs; {8, 16} with 2 blocks 10,978, 240 and
  // 6,936,832.
  void cnnMatchesPyTorch() {
    ModelConfig m;
    m.type = ModelType::Cnn;
    m.channels = {16, 32, 64};
    m.blocks = 3;
    const ModelSpec spec = buildModelSpec(m, 0);
    QCOMPARE(spec.paramCount(), int64_t(272186));
    int64_t buffers = 0;
    double convFlops = 0;
    for (const LayerSpec& l : spec.layers) {
      buffers += l.bufferCount();
      if (l.kind != LayerKind::Head) convFlops += l.forwardFlopsPerSample;
    }
    QCOMPARE(buffers, int64_t(1568));
    QCOMPARE(convFlops, 62042624.0);
    QCOMPARE(spec.layerNames(), modelLayerNames(m));
    QCOMPARE(spec.layers.size(), size_t(11));  // stem, 9 blocks, head
    QCOMPARE(spec.layers.front().name, std::string("stem"));
    QCOMPARE(spec.layers.front().kind, LayerKind::Embedding);
    QCOMPARE(spec.samplePositions, 1);
    // block.3 is layer2.0: stride 2, 16 -> 32 channels, with the 1x1 projection shortcut.
    const LayerSpec& b3 = spec.layers[4];
    QCOMPARE(b3.name, std::string("block.3"));
    std::vector<std::string> names;
    for (const ParamSpec& p : b3.params) names.push_back(p.name);
    QCOMPARE(names,
             (std::vector<std::string>{"layer2.0.conv1.weight", "layer2.0.bn1.weight", "layer2.0.bn1.bias",
                                       "layer2.0.conv2.weight", "layer2.0.bn2.weight", "layer2.0.bn2.bias",
                                       "layer2.0.downsample.0.weight", "layer2.0.downsample.1.weight",
                                       "layer2.0.downsample.1.bias"}));
    QCOMPARE(b3.params[0].shape, (std::vector<int64_t>{32, 16, 3, 3}));
    QCOMPARE(b3.params[6].shape, (std::vector<int64_t>{32, 16, 1, 1}));
    QCOMPARE(b3.buffers.size(), size_t(6));
    QCOMPARE(b3.buffers[1].name, std::string("layer2.0.bn1.running_var"));
    QCOMPARE(b3.buffers[1].init, ParamSpec::Init::Ones);
    // He et al. 2015's fan-out init of the convolutions; BatchNorm weights 1, biases 0, no decay.
    QCOMPARE(b3.params[0].std, std::sqrt(2.0 / (32 * 9)));
    QVERIFY(b3.params[0].decay && !b3.params[1].decay);
    // block.4 (layer2.1) keeps its shape: no shortcut convolution.
    QCOMPARE(spec.layers[5].params.size(), size_t(6));
    // Sides 28, 14, 7; the head reads 64 channels.
    QCOMPARE(cnnStageSides(m), (std::vector<int>{28, 14, 7}));
    QCOMPARE(spec.layers.back().params[0].shape, (std::vector<int64_t>{64, 10}));
    QCOMPARE(spec.layers[9].outputBytesPerSample, int64_t(64 * 7 * 7 * 4));
    // What a projection block keeps: five (c, side, side) tensors; a plain one four (cnn_layers.cpp).
    QCOMPARE(b3.activationBytesPerSample, int64_t(5 * 32 * 14 * 14 * 4));
    QCOMPARE(spec.layers[5].activationBytesPerSample, int64_t(4 * 32 * 14 * 14 * 4));

    m.channels = {8, 16};
    m.blocks = 2;
    const ModelSpec small = buildModelSpec(m, 0);
    QCOMPARE(small.paramCount(), int64_t(10978));
    buffers = 0;
    convFlops = 0;
    for (const LayerSpec& l : small.layers) {
      buffers += l.bufferCount();
      if (l.kind != LayerKind::Head) convFlops += l.forwardFlopsPerSample;
    }
    QCOMPARE(buffers, int64_t(240));
    QCOMPARE(convFlops, 6936832.0);
    // An odd side rounds up, as a stride-2 3x3 convolution with padding 1 does: 9 -> 5 -> 3.
    m.imageSize = 9;
    m.channels = {4, 4, 4};
    QCOMPARE(cnnStageSides(m), (std::vector<int>{9, 5, 3}));
  }
};

QTEST_APPLESS_MAIN(TestModelSpec)
#include "tst_model_spec.moc"
